package dev.pocket.chat

import android.app.Application
import android.net.Uri
import androidx.lifecycle.AndroidViewModel
import androidx.lifecycle.viewModelScope
import kotlin.coroutines.cancellation.CancellationException
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.update
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import uniffi.pocket.ChatMessage
import uniffi.pocket.GenerateOptions
import uniffi.pocket.PocketModel
import uniffi.pocket.PocketSession
import uniffi.pocket.SessionOptions
import uniffi.pocket.chatFlow
import uniffi.pocket.loadAsset
import uniffi.pocket.loadUri

/** One message; [id] finds a reply again after other turns came and went. */
data class Turn(val id: Long, val role: String, val text: String)

data class ChatState(
    val assetModels: List<String> = emptyList(),
    val modelName: String? = null,
    val turns: List<Turn> = emptyList(),
    val generating: Boolean = false,
    val loading: Boolean = false,
    val status: String = "Pick a model",
    val error: String? = null,
)

/** Holds the model and the session; streams answers into [state]. */
class ChatViewModel(app: Application) : AndroidViewModel(app) {
    private val _state = MutableStateFlow(ChatState(assetModels = listAssetModels()))
    val state: StateFlow<ChatState> = _state

    private var model: PocketModel? = null
    private var session: PocketSession? = null
    private var generation: Job? = null
    private var nextTurnId = 0L

    private fun listAssetModels(): List<String> =
        getApplication<Application>().assets.list("")?.filter { it.endsWith(".gguf") }?.sorted() ?: emptyList()

    /** A model shipped uncompressed in the APK's assets, mapped in place. */
    fun loadAsset(name: String) = load(name) { PocketModel.loadAsset(getApplication<Application>(), name) }

    /** A model the user picked in the system file picker. */
    fun loadUri(uri: Uri) = load(uri.lastPathSegment?.substringAfterLast('/') ?: "model") {
        PocketModel.loadUri(getApplication<Application>(), uri)
    }

    /**
     * Loads a model and starts a new chat on it. A running answer is stopped
     * first (the old session goes away), and Send stays disabled until the
     * load ends, so no answer runs on the old model while the turns are cleared.
     */
    private fun load(name: String, open: () -> PocketModel) {
        stop()
        _state.update { it.copy(loading = true, status = "Loading $name…", error = null) }
        viewModelScope.launch {
            try {
                val (newModel, newSession) = withContext(Dispatchers.IO) {
                    val m = open()
                    // A sliding window: long chats keep going instead of failing with ContextFull.
                    m to PocketSession(m, SessionOptions(contextLength = 4096u, slidingWindow = true))
                }
                session?.destroy()
                model?.destroy()
                model = newModel
                session = newSession
                val info = newModel.info()
                val experts = if (info.expertCount > 0u) " · ${info.expertUsedCount}/${info.expertCount} experts" else ""
                _state.update {
                    it.copy(
                        modelName = name,
                        turns = emptyList(),
                        loading = false,
                        status = "${info.architecture} · ${info.quantization} · ${info.parameterCount / 1_000_000u}M params$experts",
                    )
                }
            } catch (e: CancellationException) {
                throw e
            } catch (e: Throwable) {
                // PocketException from the engine or the loaders (including a compressed asset or a
                // revoked URI), and anything else, e.g. UnsatisfiedLinkError for a missing library.
                _state.update { it.copy(loading = false, status = "Pick a model", error = describe(e)) }
            }
        }
    }

    fun send(text: String) {
        val session = session ?: return
        if (_state.value.generating || _state.value.loading || text.isBlank()) return
        val history = _state.value.turns + Turn(nextTurnId++, "user", text.trim())
        val reply = Turn(nextTurnId++, "assistant", "")
        _state.update { it.copy(turns = history + reply, generating = true, error = null) }
        generation = viewModelScope.launch {
            try {
                session.chatFlow(
                    history.map { ChatMessage(role = it.role, content = it.text) },
                    GenerateOptions(maxTokens = 512u, temperature = 0.7f),
                ) { stats ->
                    _state.update {
                        it.copy(
                            status = "%.1f tok/s · %d tokens · first token %.0f ms · %s".format(
                                stats.decodeTokensPerSecond,
                                stats.generatedTokens.toInt(),
                                stats.timeToFirstTokenMs,
                                stats.stopReason.name.lowercase(),
                            ),
                        )
                    }
                }.collect { piece ->
                    // By id: "New chat" or a load may have removed the reply meanwhile.
                    _state.update { st ->
                        st.copy(turns = st.turns.map { if (it.id == reply.id) it.copy(text = it.text + piece) else it })
                    }
                }
            } catch (e: CancellationException) {
                throw e
            } catch (e: Throwable) {
                _state.update { it.copy(error = describe(e)) }
            } finally {
                _state.update { it.copy(generating = false) }
            }
        }
    }

    /** Stop button: cancelling the collector cancels the engine within a token. */
    fun stop() {
        generation?.cancel()
    }

    fun clear() {
        stop()
        _state.update { it.copy(turns = emptyList()) }
    }

    private fun describe(e: Throwable): String = e.message ?: e.javaClass.simpleName

    override fun onCleared() {
        generation?.cancel()
        // UniFFI frees the Rust objects once in-flight calls have returned.
        session?.destroy()
        model?.destroy()
    }
}
