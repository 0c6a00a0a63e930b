// Kotlin coroutines layer over the generated bindings (pocket.kt): generation
// as a cold Flow<String> whose cancellation cancels the session.
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

private fun PocketSession.tokenFlow(
    onStats: (GenerationStats) -> Unit,
    request: (TokenListener) -> GenerationStats,
): Flow<String> {
    val session = this
    return callbackFlow {
        // False once the collector is gone: the listener then stops the engine too.
        val open = AtomicBoolean(true)
        // True once the request has returned: a late close must not cancel a later request.
        val finished = AtomicBoolean(false)
        val listener = object : TokenListener {
            override fun onToken(piece: String): Boolean = open.get() && trySendBlocking(piece).isSuccess
        }
        launch(Dispatchers.IO) {
            try {
                val stats = request(listener)
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
