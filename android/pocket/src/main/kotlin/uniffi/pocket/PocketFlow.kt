// Kotlin coroutines layer over the generated bindings (pocket.kt): generation
// as a cold Flow (of text pieces, or of GenerationEvents) whose cancellation
// cancels the session, and JSON answers constrained by a schema.
// Pure Kotlin (no Android APIs), so it is tested on the JVM too
// (bindings/tests/kotlin).

package uniffi.pocket

import java.util.concurrent.atomic.AtomicBoolean
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.channels.awaitClose
import kotlinx.coroutines.channels.trySendBlocking
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.buffer
import kotlinx.coroutines.flow.callbackFlow
import kotlinx.coroutines.launch

/**
 * Streams the completion of [prompt] as text pieces.
 *
 * The flow is cold: each collection runs one request on [Dispatchers.IO].
 * Cancelling the collector (or its scope, e.g. a ViewModel's) calls
 * [PocketSession.cancel] and the flow completes once the engine has stopped,
 * within a token. Engine errors arrive as [PocketException]. [onStats]
 * receives the request's figures (tokens/s, stop reason) when it ends, on the
 * generating thread.
 */
fun PocketSession.generateFlow(
    prompt: String,
    options: GenerateOptions = GenerateOptions(),
    onStats: (GenerationStats) -> Unit = {},
): Flow<String> = tokenFlow(onStats) { listener -> generate(prompt, options, listener) }

/** Like [generateFlow], answering [messages] through the model's chat template. */
fun PocketSession.chatFlow(
    messages: List<ChatMessage>,
    options: GenerateOptions = GenerateOptions(),
    onStats: (GenerationStats) -> Unit = {},
): Flow<String> = tokenFlow(onStats) { listener -> chat(messages, options, listener) }

/**
 * Like [chatFlow], reporting every [GenerationEvent] as it happens: answer
 * text ([GenerationEvent.Text]), thinking ([GenerationEvent.Reasoning]) and
 * tool calls ([GenerationEvent.ToolCall], each complete and valid against its
 * tool's schema). [onStats] receives the figures, with `reasoning` and
 * `toolCalls`, when the request ends.
 *
 *     session.chatEventsFlow(messages, GenerateOptions(tools = listOf(clock))).collect { event ->
 *         when (event) {
 *             is GenerationEvent.Text -> answer += event.piece
 *             is GenerationEvent.Reasoning -> thought += event.piece
 *             is GenerationEvent.ToolCall -> calls += event.call
 *         }
 *     }
 */
fun PocketSession.chatEventsFlow(
    messages: List<ChatMessage>,
    options: GenerateOptions = GenerateOptions(),
    onStats: (GenerationStats) -> Unit = {},
): Flow<GenerationEvent> = requestFlow(onStats) { send ->
    chatEvents(messages, options, object : EventListener {
        override fun onEvent(event: GenerationEvent): Boolean = send(event)
    })
}

/** Like [generateFlow], reporting every [GenerationEvent] (see [chatEventsFlow]). */
fun PocketSession.generateEventsFlow(
    prompt: String,
    options: GenerateOptions = GenerateOptions(),
    onStats: (GenerationStats) -> Unit = {},
): Flow<GenerationEvent> = requestFlow(onStats) { send ->
    generateEvents(prompt, options, object : EventListener {
        override fun onEvent(event: GenerationEvent): Boolean = send(event)
    })
}

/**
 * The answer to [messages] as JSON valid against [schema] (a JSON Schema as
 * text), constrained token by token: `options` with `jsonSchema = schema`.
 * Runs on [Dispatchers.IO]; cancelling the calling coroutine cancels the
 * session. A schema the engine refuses is [PocketException.InvalidArgument];
 * an answer that stopped before its end (`maxTokens` reached, a stop string,
 * `cancel()` from elsewhere) is [IncompleteAnswerException], since its JSON is
 * cut short.
 *
 * The AAR carries no JSON library: decode the text with the app's own (see [respond]).
 */
suspend fun PocketSession.respondJson(
    messages: List<ChatMessage>,
    schema: String,
    options: GenerateOptions = GenerateOptions(),
): String {
    var stats: GenerationStats? = null
    val text = StringBuilder()
    chatFlow(messages, options.copy(jsonSchema = schema)) { stats = it }.collect { text.append(it) }
    val done = stats ?: throw IllegalStateException("the request ended without its figures")
    if (done.stopReason != StopReason.END_OF_TEXT) throw IncompleteAnswerException(done)
    return text.toString()
}

/**
 * [respondJson] decoded into a typed value by [decode], the app's JSON
 * library, e.g. with kotlinx.serialization
 * `session.respond(messages, schema) { Json.decodeFromString<Person>(it) }`, or
 * on Android `{ JSONObject(it).let { o -> Person(o.getString("name"), o.getInt("age")) } }`.
 */
suspend fun <T> PocketSession.respond(
    messages: List<ChatMessage>,
    schema: String,
    options: GenerateOptions = GenerateOptions(),
    decode: (String) -> T,
): T = decode(respondJson(messages, schema, options))

/** A constrained answer that stopped before its end ([stats]`.stopReason`), so its JSON is incomplete. */
class IncompleteAnswerException(val stats: GenerationStats) :
    Exception("the answer stopped (${stats.stopReason}) before its JSON was complete; raise maxTokens if it was MAX_TOKENS")

private fun PocketSession.tokenFlow(
    onStats: (GenerationStats) -> Unit,
    request: (TokenListener) -> GenerationStats,
): Flow<String> = requestFlow(onStats) { send ->
    request(object : TokenListener {
        override fun onToken(piece: String): Boolean = send(piece)
    })
}

/**
 * One request on [Dispatchers.IO] as a cold flow: [request] runs the engine
 * with a listener that forwards each item through `send` (false once the
 * collector is gone, which stops the engine too).
 */
private fun <T> PocketSession.requestFlow(
    onStats: (GenerationStats) -> Unit,
    request: (send: (T) -> Boolean) -> GenerationStats,
): Flow<T> {
    val session = this
    return callbackFlow {
        // False once the collector is gone: the listener then stops the engine too.
        val open = AtomicBoolean(true)
        // True once the request has returned: a late close must not cancel a later request.
        val finished = AtomicBoolean(false)
        val send: (T) -> Boolean = { item -> open.get() && trySendBlocking(item).isSuccess }
        launch(Dispatchers.IO) {
            try {
                val stats = request(send)
                finished.set(true)
                onStats(stats)
                channel.close()
            } catch (e: Throwable) {
                finished.set(true)
                channel.close(e)
            }
        }
        awaitClose {
            // Cancel first: a token in flight then reports Cancelled, not a stopped listener.
            if (!finished.get()) session.cancel()
            open.set(false)
        }
    }.buffer(Channel.UNLIMITED)
}
