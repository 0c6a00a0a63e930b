package dev.pocket.chat

import android.app.Application
import android.net.Uri
import androidx.lifecycle.AndroidViewModel
import androidx.lifecycle.viewModelScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.update
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import uniffi.pocket.ChatMessage
import uniffi.pocket.GenerateOptions
import uniffi.pocket.PocketException
import uniffi.pocket.PocketModel
import uniffi.pocket.PocketSession
import uniffi.pocket.SessionOptions
import uniffi.pocket.chatFlow
import uniffi.pocket.loadAsset
import uniffi.pocket.loadUri

data class Turn(val role: String, val text: String)

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

    private fun listAssetModels(): List<String> =
        getApplication<Application>().assets.list("")?.filter { it.endsWith(".gguf") }?.sorted() ?: emptyList()

    /** A model shipped uncompressed in the APK's assets, mapped in place. */
    fun loadAsset(name: String) = load(name) { PocketModel.loadAsset(getApplication<Application>(), name) }

    /** A model the user picked in the system file picker. */
    fun loadUri(uri: Uri) = load(uri.lastPathSegment?.substringAfterLast('/') ?: "model") {
        PocketModel.loadUri(getApplication<Application>(), uri)
    }

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
            } catch (e: PocketException) {
                _state.update { it.copy(loading = false, status = "Pick a model", error = e.message) }
            }
        }
    }

    fun send(text: String) {
        val session = session ?: return
        if (_state.value.generating || text.isBlank()) return
        val history = _state.value.turns + Turn("user", text.trim())
        _state.update { it.copy(turns = history + Turn("assistant", ""), generating = true, error = null) }
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
                    _state.update { st ->
                        val last = st.turns.last()
                        st.copy(turns = st.turns.dropLast(1) + last.copy(text = last.text + piece))
                    }
                }
            } catch (e: PocketException) {
                _state.update { it.copy(error = e.message) }
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

    override fun onCleared() {
        generation?.cancel()
        // UniFFI frees the Rust objects once in-flight calls have returned.
        session?.destroy()
        model?.destroy()
    }
}
