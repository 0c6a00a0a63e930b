"""Structured output through the Python bindings: a JSON-Schema answer that
parses and validates, regex and choices, refusals (a bad schema, thinking on
a model without it), the event listener, a tool call answered with its
result, and the caller's own chat template."""

import json
import re

import pytest

import pocket

GREEDY = dict(temperature=0.0)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

CLOCK = pocket.ToolSpec(
    name="get_time",
    description="The current time in a time zone",
    parameters_json=json.dumps(
        {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "local"]}},
            "required": ["zone"],
            "additionalProperties": False,
        }
    ),
)


class Collect(pocket.TokenListener):
    def __init__(self):
        self.pieces = []

    def on_token(self, piece):
        self.pieces.append(piece)
        return True


class Events(pocket.EventListener):
    """Records events; stops after `limit` of them when given."""

    def __init__(self, limit=None):
        self.events = []
        self.limit = limit

    def on_event(self, event):
        self.events.append(event)
        return self.limit is None or len(self.events) < self.limit


def user(text):
    return [pocket.ChatMessage(role="user", content=text)]


@pytest.fixture
def chat(instruct):
    return pocket.PocketSession(instruct, pocket.SessionOptions(context_length=1024))


def test_new_fields_have_defaults():
    g = pocket.GenerateOptions()
    assert (g.json_schema, g.grammar, g.regex, g.choices) == (None, None, None, [])
    assert (g.tools, g.tool_choice, g.reasoning) == ([], None, None)
    m = pocket.ChatMessage(role="user", content="hi")
    assert (m.tool_calls, m.tool_call_id) == ([], None)
    assert pocket.LoadOptions().chat_template is None
    assert pocket.ToolSpec(name="t", description="d").parameters_json == "{}"


def test_a_json_schema_answer_parses_and_validates(chat):
    opts = pocket.GenerateOptions(max_tokens=160, json_schema=json.dumps(PERSON), **GREEDY)
    messages = user("Invent a person. Answer in JSON with their name, age and city.")
    stats = chat.chat(messages, opts, Collect())
    assert stats.stop_reason == pocket.StopReason.END_OF_TEXT, stats.text
    person = json.loads(stats.text)
    assert isinstance(person, dict)
    assert {"name", "age"} <= person.keys() <= {"name", "age", "city"}, person
    assert isinstance(person["name"], str) and len(person["name"]) <= 24
    assert isinstance(person["age"], int) and not isinstance(person["age"], bool)
    assert 0 <= person["age"] <= 150
    if "city" in person:
        assert isinstance(person["city"], str) and len(person["city"]) <= 24


def test_regex_and_choices_constrain_the_answer(chat):
    stats = chat.chat(user("What is 6 times 7? Answer with a number."), pocket.GenerateOptions(max_tokens=8, regex="[0-9]{1,3}", **GREEDY), Collect())
    assert re.fullmatch("[0-9]{1,3}", stats.text), stats.text
    stats = chat.chat(user("Is the sky blue? Answer yes or no."), pocket.GenerateOptions(max_tokens=8, choices=["yes", "no"], **GREEDY), Collect())
    assert stats.text in ("yes", "no")
    assert stats.stop_reason == pocket.StopReason.END_OF_TEXT


def test_bad_schemas_and_two_constraints_are_invalid_arguments(chat):
    for schema in ["{not json", json.dumps({"type": "object", "not": {"required": ["x"]}}), "[1, 2]"]:
        with pytest.raises(pocket.PocketError.InvalidArgument) as e:
            chat.chat(user("Hi"), pocket.GenerateOptions(max_tokens=8, json_schema=schema), Collect())
        assert "json_schema" in e.value.reason
    with pytest.raises(pocket.PocketError.InvalidArgument, match="regex"):
        chat.chat(user("Hi"), pocket.GenerateOptions(max_tokens=8, regex="("), Collect())
    with pytest.raises(pocket.PocketError.InvalidArgument, match="one constraint"):
        chat.chat(user("Hi"), pocket.GenerateOptions(max_tokens=8, regex="a", choices=["a"]), Collect())


def test_reasoning_needs_a_model_that_thinks(chat):
    for reasoning in (pocket.Reasoning.ON(), pocket.Reasoning.BUDGET(max_tokens=16)):
        with pytest.raises(pocket.PocketError.InvalidArgument, match="reasoning"):
            chat.chat(user("Hi"), pocket.GenerateOptions(max_tokens=8, reasoning=reasoning), Collect())
    # Off and Default are fine on any model.
    for reasoning in (pocket.Reasoning.OFF(), pocket.Reasoning.DEFAULT(), None):
        stats = chat.chat(user("Hi"), pocket.GenerateOptions(max_tokens=4, reasoning=reasoning, **GREEDY), Collect())
        assert stats.generated_tokens > 0 and stats.reasoning == ""


def test_chat_events_receive_text_and_the_token_listener_the_same(chat):
    plain = Collect()
    expected = chat.chat(user("Say hello."), pocket.GenerateOptions(max_tokens=12, **GREEDY), plain)
    chat.reset()
    listener = Events()
    stats = chat.chat_events(user("Say hello."), pocket.GenerateOptions(max_tokens=12, **GREEDY), listener)
    assert listener.events and all(e.is_text() for e in listener.events)
    assert [e.piece for e in listener.events] == plain.pieces
    assert stats.text == expected.text == "".join(e.piece for e in listener.events)
    assert stats.reasoning == "" and stats.tool_calls == []

    generated = Events()
    stats = chat.generate_events("Once upon a time", pocket.GenerateOptions(max_tokens=5, **GREEDY), generated)
    assert "".join(e.piece for e in generated.events) == stats.text


def test_an_event_listener_that_returns_false_stops(chat):
    listener = Events(limit=2)
    stats = chat.chat_events(user("Tell me a story."), pocket.GenerateOptions(max_tokens=64, **GREEDY), listener)
    assert stats.stop_reason == pocket.StopReason.LISTENER_STOPPED
    assert len(listener.events) >= 2


def test_a_tool_call_answered_with_its_result(chat):
    opts = pocket.GenerateOptions(max_tokens=96, tools=[CLOCK], tool_choice=pocket.ToolChoice.REQUIRED(), **GREEDY)
    question = user("What time is it in UTC?")
    listener = Events()
    first = chat.chat_events(question, opts, listener)
    assert first.stop_reason == pocket.StopReason.TOOL_CALLS, first.text
    calls = [e.call for e in listener.events if e.is_tool_call()]
    assert calls == first.tool_calls and len(calls) == 1
    call = calls[0]
    assert call.name == "get_time" and call.id
    assert json.loads(call.arguments_json)["zone"] in ("UTC", "local")

    history = question + [
        pocket.ChatMessage(role="assistant", content="", tool_calls=calls),
        pocket.ChatMessage(role="tool", content=json.dumps({"time": "12:00"}), tool_call_id=call.id),
    ]
    second = chat.chat(history, pocket.GenerateOptions(max_tokens=16, tools=[CLOCK], **GREEDY), Collect())
    assert second.prompt_tokens > first.prompt_tokens and second.generated_tokens > 0


def test_tools_need_chat_and_named_choices_need_tools(chat):
    with pytest.raises(pocket.PocketError.InvalidArgument, match="tools"):
        chat.generate("Hi", pocket.GenerateOptions(max_tokens=4, tools=[CLOCK]), Collect())
    with pytest.raises(pocket.PocketError.InvalidArgument, match="tool_choice"):
        chat.chat(user("Hi"), pocket.GenerateOptions(max_tokens=4, tool_choice=pocket.ToolChoice.NAMED(name="get_time")), Collect())


def test_the_caller_s_chat_template_replaces_the_file_s(moe_path):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
    model = pocket.PocketModel.load(moe_path, pocket.LoadOptions(chat_template=template))
    session = pocket.PocketSession(model, pocket.SessionOptions(context_length=256))
    assert session.chat(user("Hi"), pocket.GenerateOptions(max_tokens=2, **GREEDY), Collect()).generated_tokens == 2
    with pytest.raises(pocket.PocketError.InvalidArgument, match="chat_template"):
        pocket.PocketModel.load(moe_path, pocket.LoadOptions(chat_template="{% if %}"))
