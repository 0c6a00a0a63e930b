// Structured output from Swift (the same checks as the Python and Kotlin
// suites, on the tiny MoE fixture, whose answers are noise that still obeys
// the constraints): respond(to:generating:schema:), regex and choices,
// refusals, chatEvents as an AsyncThrowingStream, a tool call answered with
// its result, the caller's chat template.

import Foundation
import XCTest

@testable import Pocket

final class StructuredTests: XCTestCase {
    struct Person: Decodable {
        let name: String
        let age: Int
    }

    static let person = #"""
        {"type": "object",
         "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
         "required": ["name", "age"], "additionalProperties": false}
        """#

    static let clock = ToolSpec(
        name: "get_time",
        description: "The current time in a time zone",
        parametersJson: #"{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","local"]}},"required":["zone"],"additionalProperties":false}"#
    )

    func greedy(_ n: UInt32) -> GenerateOptions { GenerateOptions(maxTokens: n, temperature: 0) }
    func session() throws -> PocketSession {
        try PocketSession(model: PocketTests.moe, options: SessionOptions(contextLength: 512))
    }
    func user(_ text: String) -> [ChatMessage] { [ChatMessage(role: "user", content: text)] }

    func testNewFieldsHaveDefaults() {
        let g = GenerateOptions()
        XCTAssertNil(g.jsonSchema)
        XCTAssertNil(g.grammar)
        XCTAssertNil(g.regex)
        XCTAssertTrue(g.choices.isEmpty && g.tools.isEmpty)
        XCTAssertNil(g.toolChoice)
        XCTAssertNil(g.reasoning)
        let m = ChatMessage(role: "user", content: "hi")
        XCTAssertTrue(m.toolCalls.isEmpty)
        XCTAssertNil(m.toolCallId)
        XCTAssertNil(LoadOptions().chatTemplate)
    }

    func testRespondDecodesASchemaConstrainedAnswer() async throws {
        let person = try await session().respond(to: user("Invent a person."), generating: Person.self, schema: Self.person, options: greedy(160))
        XCTAssertLessThanOrEqual(person.name.count, 24)
        XCTAssertTrue((0...150).contains(person.age))
        do {
            _ = try await session().respond(to: user("Invent a person."), generating: Person.self, schema: Self.person, options: greedy(2))
            XCTFail("a two-token answer decoded")
        } catch PocketAnswerError.incomplete(let stopReason, _) {
            XCTAssertEqual(stopReason, .maxTokens)
        }
    }

    func testRegexAndChoices() throws {
        let s = try session()
        var opts = greedy(8)
        opts.regex = "[0-9]{1,3}"
        let number = try s.chat(messages: user("6 times 7?"), options: opts, listener: Collect()).text
        XCTAssertNotNil(number.range(of: "^[0-9]{1,3}$", options: .regularExpression), number)
        var pick = greedy(8)
        pick.choices = ["yes", "no"]
        XCTAssertTrue(["yes", "no"].contains(try s.chat(messages: user("Yes or no?"), options: pick, listener: Collect()).text))
    }

    func testBadSchemasAndThinkingWithoutAThinkingFormatAreInvalidArguments() throws {
        let s = try session()
        var bad = greedy(8)
        bad.jsonSchema = "{not json"
        XCTAssertThrowsError(try s.chat(messages: user("Hi"), options: bad, listener: Collect())) { error in
            guard case PocketError.InvalidArgument(let reason) = error else { return XCTFail("\(error)") }
            XCTAssertTrue(reason.contains("json_schema"), reason)
        }
        for reasoning in [Reasoning.on, .budget(maxTokens: 16)] {
            var opts = greedy(8)
            opts.reasoning = reasoning
            XCTAssertThrowsError(try s.chat(messages: user("Hi"), options: opts, listener: Collect())) { error in
                guard case PocketError.InvalidArgument(let reason) = error else { return XCTFail("\(error)") }
                XCTAssertTrue(reason.contains("reasoning"), reason)
            }
        }
    }

    func testChatEventsStreamTheTokenListenersText() async throws {
        let expected = try session().chat(messages: user("Hello"), options: greedy(12), listener: Collect()).text
        var text = ""
        for try await event in try session().chatEvents(messages: user("Hello"), options: greedy(12)) {
            guard case .text(let piece) = event else { return XCTFail("\(event)") }
            text += piece
        }
        XCTAssertEqual(text, expected)
    }

    func testARequiredToolCallAnsweredWithItsResult() async throws {
        let s = try session()
        var opts = greedy(96)
        opts.tools = [Self.clock]
        opts.toolChoice = .required
        let stats = StatsBox()
        var calls: [ToolCall] = []
        for try await event in s.chatEvents(messages: user("What time is it?"), options: opts, onStats: { stats.value = $0 }) {
            if case .toolCall(let call) = event {
                calls.append(call)
            }
        }
        let first = try XCTUnwrap(stats.value)
        XCTAssertEqual(first.stopReason, .toolCalls)
        XCTAssertEqual(calls, first.toolCalls)
        XCTAssertEqual(calls.count, 1)
        XCTAssertEqual(calls.first?.name, "get_time")
        let history = user("What time is it?") + [
            ChatMessage(role: "assistant", content: "", toolCalls: calls),
            ChatMessage(role: "tool", content: #"{"time":"12:00"}"#, toolCallId: calls[0].id),
        ]
        var next = greedy(4)
        next.tools = [Self.clock]
        let second = try s.chat(messages: history, options: next, listener: Collect())
        XCTAssertGreaterThan(second.promptTokens, first.promptTokens)
    }

    func testTheCallersChatTemplate() throws {
        let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
        let model = try PocketModel.load(path: PocketTests.moePath, options: LoadOptions(chatTemplate: template))
        let s = try PocketSession(model: model, options: SessionOptions(contextLength: 256))
        XCTAssertEqual(try s.chat(messages: user("Hi"), options: greedy(2), listener: Collect()).generatedTokens, 2)
        XCTAssertThrowsError(try PocketModel.load(path: PocketTests.moePath, options: LoadOptions(chatTemplate: "{% if %}"))) { error in
            guard case PocketError.InvalidArgument = error else { return XCTFail("\(error)") }
        }
    }
}
