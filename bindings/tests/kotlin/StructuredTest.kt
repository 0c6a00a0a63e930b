// Structured output from Kotlin: a JSON-Schema answer that parses and
// validates, regex and choices, refusals (a bad schema, thinking on a model
// without it), events through the listener and chatEventsFlow, a tool call
// answered with its result, and respondJson/respond. Registered by main() in
// PocketTest.kt.

import java.io.File
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import uniffi.pocket.*

/**
 * SmolLM2-135M-Instruct when it is in the cache (POCKET_SMOLLM2, default
 * $POCKET_CACHE or ~/.cache/pocket/smollm2-135m-instruct-q4_1.gguf; nothing is
 * downloaded), else the tiny Gemma 3 fixture, whose answers are noise but
 * still obey the constraints.
 */
private fun instructModelPath(): String {
    val cache = System.getenv("POCKET_CACHE")?.let(::File) ?: File(System.getProperty("user.home"), ".cache/pocket")
    val smollm2 = System.getenv("POCKET_SMOLLM2")?.let(::File) ?: File(cache, "smollm2-135m-instruct-q4_1.gguf")
    return if (smollm2.isFile) smollm2.path else fixtureModel("gemma3-tiny-Q8_0.gguf")
}

private const val PERSON = """{"type":"object","properties":{"name":{"type":"string","maxLength":24},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],"additionalProperties":false}"""

private val clock = ToolSpec(
    name = "get_time",
    description = "The current time in a time zone",
    parametersJson = """{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","local"]}},"required":["zone"],"additionalProperties":false}""",
)

private fun user(text: String) = listOf(ChatMessage(role = "user", content = text))

private class Events(val limit: Int = Int.MAX_VALUE) : EventListener {
    val events = java.util.Collections.synchronizedList(mutableListOf<GenerationEvent>())
    override fun onEvent(event: GenerationEvent): Boolean {
        events += event
        return events.size < limit
    }
}

/** A small JSON reader (the JVM test has no JSON library): objects, arrays, strings, numbers, literals. */
private class Json(private val s: String) {
    private var i = 0

    fun parse(): Any? = value().also { space(); require(i == s.length) { "trailing text at $i in $s" } }

    private fun space() { while (i < s.length && s[i] in " \t\r\n") i++ }

    private fun value(): Any? {
        space()
        require(i < s.length) { "end of text in $s" }
        return when (s[i]) {
            '{' -> {
                i++
                val o = LinkedHashMap<String, Any?>()
                space()
                if (s[i] == '}') { i++; return o }
                while (true) {
                    space()
                    val k = string()
                    space(); require(s[i++] == ':') { "':' expected in $s" }
                    require(o.put(k, value()) == null) { "duplicate key $k" }
                    space()
                    when (s[i++]) { ',' -> continue; '}' -> return o; else -> error("',' or '}' expected in $s") }
                }
                @Suppress("UNREACHABLE_CODE") o
            }
            '[' -> {
                i++
                val a = mutableListOf<Any?>()
                space()
                if (s[i] == ']') { i++; return a }
                while (true) {
                    a += value()
                    space()
                    when (s[i++]) { ',' -> continue; ']' -> return a; else -> error("',' or ']' expected in $s") }
                }
                @Suppress("UNREACHABLE_CODE") a
            }
            '"' -> string()
            't' -> literal("true", true)
            'f' -> literal("false", false)
            'n' -> literal("null", null)
            else -> {
                val m = Regex("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?").matchAt(s, i) ?: error("bad value at $i in $s")
                i += m.value.length
                if (m.groupValues[2].isEmpty() && m.groupValues[3].isEmpty()) m.value.toLong() else m.value.toDouble()
            }
        }
    }

    private fun literal(word: String, v: Any?): Any? {
        require(s.startsWith(word, i)) { "bad literal at $i in $s" }
        i += word.length
        return v
    }

    private fun string(): String {
        require(s[i++] == '"') { "string expected at ${i - 1} in $s" }
        val b = StringBuilder()
        while (true) {
            val c = s[i++]
            when {
                c == '"' -> return b.toString()
                c == '\\' -> when (val e = s[i++]) {
                    'u' -> { b.append(s.substring(i, i + 4).toInt(16).toChar()); i += 4 }
                    'n' -> b.append('\n'); 't' -> b.append('\t'); 'r' -> b.append('\r')
                    'b' -> b.append('\b'); 'f' -> b.append('\u000c')
                    else -> b.append(e)
                }
                c < ' ' -> error("control character in a string in $s")
                else -> b.append(c)
            }
        }
    }
}

/** The checks of PERSON, by hand. */
private fun checkPerson(text: String) {
    val o = Json(text).parse()
    expect(o is Map<*, *> && o.keys == setOf("name", "age")) { "not a person: $text" }
    val m = o as Map<*, *>
    val name = m["name"]
    val age = m["age"]
    expect(name is String && name.length <= 24) { "name: $text" }
    expect(age is Long && age in 0L..150L) { "age: $text" }
}

internal fun structuredTests(moePath: String) {
    val instruct = PocketModel.load(instructModelPath(), LoadOptions())
    fun chat() = PocketSession(instruct, SessionOptions(contextLength = 1024u))

    test("structured: new fields have defaults") {
        val g = GenerateOptions()
        expect(g.jsonSchema == null && g.grammar == null && g.regex == null && g.choices.isEmpty()) { "$g" }
        expect(g.tools.isEmpty() && g.toolChoice == null && g.reasoning == null) { "$g" }
        val m = ChatMessage(role = "user", content = "hi")
        expect(m.toolCalls.isEmpty() && m.toolCallId == null) { "$m" }
        expect(LoadOptions().chatTemplate == null) { "chatTemplate" }
        expect(ToolSpec(name = "t", description = "d").parametersJson == "{}") { "parametersJson" }
    }

    test("structured: a JSON-Schema answer parses and validates") {
        val stats = chat().chat(user("Invent a person. Answer in JSON with their name and age."), greedy(160u).copy(jsonSchema = PERSON), Collect())
        expect(stats.stopReason == StopReason.END_OF_TEXT) { "${stats.stopReason}: ${stats.text}" }
        checkPerson(stats.text)
    }

    test("structured: regex and choices constrain the answer") {
        val s = chat()
        val number = s.chat(user("What is 6 times 7? Answer with a number."), greedy(8u).copy(regex = "[0-9]{1,3}"), Collect()).text
        expect(Regex("[0-9]{1,3}").matches(number)) { number }
        val yesNo = s.chat(user("Is the sky blue? Answer yes or no."), greedy(8u).copy(choices = listOf("yes", "no")), Collect()).text
        expect(yesNo == "yes" || yesNo == "no") { yesNo }
    }

    test("structured: a bad schema, two constraints and thinking without a thinking format are InvalidArgument") {
        val s = chat()
        for (schema in listOf("{not json", """{"type":"object","not":{}}""")) {
            val e = expectThrows<PocketException.InvalidArgument> { s.chat(user("Hi"), greedy(8u).copy(jsonSchema = schema), Collect()) }
            expect(e.reason.contains("json_schema")) { e.reason }
        }
        expectThrows<PocketException.InvalidArgument> { s.chat(user("Hi"), greedy(8u).copy(regex = "a", choices = listOf("a")), Collect()) }
        for (r in listOf(Reasoning.On, Reasoning.Budget(maxTokens = 16u))) {
            val e = expectThrows<PocketException.InvalidArgument> { s.chat(user("Hi"), greedy(8u).copy(reasoning = r), Collect()) }
            expect(e.reason.contains("reasoning")) { e.reason }
        }
        expect(s.chat(user("Hi"), greedy(3u).copy(reasoning = Reasoning.Off), Collect()).generatedTokens > 0u) { "Off refused" }
    }

    test("structured: chatEvents and chatEventsFlow receive the token listener's text") {
        val s = chat()
        val plain = Collect()
        val expected = s.chat(user("Say hello."), greedy(12u), plain)
        s.reset()
        val listener = Events()
        val stats = s.chatEvents(user("Say hello."), greedy(12u), listener)
        val pieces = listener.events.map { (it as GenerationEvent.Text).piece }
        expect(pieces == plain.pieces.toList() && stats.text == expected.text) { "$pieces vs ${plain.pieces}" }
        expect(stats.reasoning.isEmpty() && stats.toolCalls.isEmpty()) { "$stats" }
        s.reset()
        var flowStats: GenerationStats? = null
        val flowed = runBlocking { s.chatEventsFlow(user("Say hello."), greedy(12u)) { flowStats = it }.toList() }
        expect(flowed.map { (it as GenerationEvent.Text).piece } == pieces && flowStats?.text == expected.text) { "$flowed" }
        val stopped = Events(limit = 2)
        expect(s.generateEvents("Once upon a time", greedy(32u), stopped).stopReason == StopReason.LISTENER_STOPPED) { "not stopped" }
    }

    test("structured: a required tool call, answered with its result") {
        val s = chat()
        val question = user("What time is it in UTC?")
        val opts = greedy(96u).copy(tools = listOf(clock), toolChoice = ToolChoice.Required)
        var stats: GenerationStats? = null
        val events = runBlocking { s.chatEventsFlow(question, opts) { stats = it }.toList() }
        val first = stats!!
        expect(first.stopReason == StopReason.TOOL_CALLS) { "$first" }
        val calls = events.filterIsInstance<GenerationEvent.ToolCall>().map { it.call }
        expect(calls == first.toolCalls && calls.size == 1 && calls[0].name == "get_time" && calls[0].id.isNotEmpty()) { "$calls" }
        val args = Json(calls[0].argumentsJson).parse() as Map<*, *>
        expect(args["zone"] == "UTC" || args["zone"] == "local") { calls[0].argumentsJson }
        val history = question + listOf(
            ChatMessage(role = "assistant", content = "", toolCalls = calls),
            ChatMessage(role = "tool", content = """{"time":"12:00"}""", toolCallId = calls[0].id),
        )
        val second = s.chat(history, greedy(16u).copy(tools = listOf(clock)), Collect())
        expect(second.promptTokens > first.promptTokens && second.generatedTokens > 0u) { "$second" }
    }

    test("structured: respondJson and respond decode a schema-constrained answer") {
        val s = chat()
        val text = runBlocking { s.respondJson(user("Invent a person."), PERSON, greedy(160u)) }
        checkPerson(text)
        data class Person(val name: String, val age: Long)
        val person = runBlocking {
            s.respond(user("Invent a person."), PERSON, greedy(160u)) { json ->
                val o = Json(json).parse() as Map<*, *>
                Person(o["name"] as String, o["age"] as Long)
            }
        }
        expect(person.age in 0L..150L) { "$person" }
        val cut = expectThrows<IncompleteAnswerException> { runBlocking { s.respondJson(user("Invent a person."), PERSON, greedy(2u)) } }
        expect(cut.stats.stopReason == StopReason.MAX_TOKENS) { "${cut.stats}" }
        expectThrows<PocketException.InvalidArgument> { runBlocking { s.respondJson(user("Hi"), "{not json") } }
    }

    test("structured: the caller's chat template replaces the file's") {
        val template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
        val model = PocketModel.load(moePath, LoadOptions(chatTemplate = template))
        expect(PocketSession(model, SessionOptions(contextLength = 256u)).chat(user("Hi"), greedy(2u), Collect()).generatedTokens == 2u) { "no tokens" }
        val e = expectThrows<PocketException.InvalidArgument> { PocketModel.load(moePath, LoadOptions(chatTemplate = "{% if %}")) }
        expect(e.reason.contains("chat_template")) { e.reason }
    }
}
