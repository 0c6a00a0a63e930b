package dev.pocket.chat

import android.app.ActivityManager
import android.app.Application
import android.net.Uri
import androidx.lifecycle.AndroidViewModel
import androidx.lifecycle.viewModelScope
import java.io.File
import kotlin.coroutines.cancellation.CancellationException
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.update
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import org.json.JSONArray
import org.json.JSONObject
import uniffi.pocket.ChatMessage
import uniffi.pocket.GenerateOptions
import uniffi.pocket.LoadOptions
import uniffi.pocket.PocketException
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

/**
 * The options of every session: a restored session must have the same context
 * length and KV type as the saved one. A sliding window: long chats keep going
 * instead of failing with ContextFull.
 */
private fun sessionOptions() = SessionOptions(contextLength = 4096u, slidingWindow = true)

/** Holds the model and the session; streams answers into [state]. */
class ChatViewModel(app: Application) : AndroidViewModel(app) {
    private val _state = MutableStateFlow(ChatState(assetModels = listAssetModels()))
    val state: StateFlow<ChatState> = _state

    private var model: PocketModel? = null
    private var session: PocketSession? = null
    private var generation: Job? = null
    private var nextTurnId = 0L
    /** The loaded model's asset name: found again at the next launch (a picked URI is not). */
    private var assetName: String? = null

    /** The session snapshot and the transcript (which model, the turns as shown). */
    private val snapshotFile get() = File(getApplication<Application>().filesDir, "chat.snapshot")
    private val transcriptFile get() = File(getApplication<Application>().filesDir, "chat.json")

    init {
        restoreLastChat()
    }

    private fun listAssetModels(): List<String> =
        getApplication<Application>().assets.list("")?.filter { it.endsWith(".gguf") }?.sorted() ?: emptyList()

    /** A model shipped uncompressed in the APK's assets, mapped in place. */
    fun loadAsset(name: String) = load(name, asset = true) {
        PocketModel.loadAsset(getApplication<Application>(), name, loadOptions(assetBytes(name)))
    }

    /** A model the user picked in the system file picker. */
    fun loadUri(uri: Uri) = load(uri.lastPathSegment?.substringAfterLast('/') ?: "model", asset = false) {
        val bytes = getApplication<Application>().contentResolver.openFileDescriptor(uri, "r")?.use { it.statSize } ?: -1L
        PocketModel.loadUri(getApplication<Application>(), uri, loadOptions(bytes))
    }

    /**
     * A memory budget when the model is larger than what the system can give
     * the app (80 % of `availMem` less the low-memory threshold, the rest left
     * to the app): the model then keeps the weights every token reads in
     * memory and reads routed experts from flash into a cache of the rest.
     * Smaller files are mapped as they are. See android/README.md.
     */
    private fun loadOptions(modelBytes: Long): LoadOptions {
        val am = getApplication<Application>().getSystemService(ActivityManager::class.java)
        val info = ActivityManager.MemoryInfo().also { am.getMemoryInfo(it) }
        val budget = (info.availMem - info.threshold) / 10 * 8
        return if (budget in 1 until modelBytes) LoadOptions(memoryBudgetBytes = budget.toULong()) else LoadOptions()
    }

    private fun assetBytes(name: String): Long =
        runCatching { getApplication<Application>().assets.openFd(name).use { it.length } }.getOrDefault(-1L)

    /**
     * Loads a model and starts a new chat on it. A running answer is stopped
     * first (the old session goes away), and Send stays disabled until the
     * load ends, so no answer runs on the old model while the turns are cleared.
     */
    private fun load(name: String, asset: Boolean, open: () -> PocketModel) {
        stop()
        _state.update { it.copy(loading = true, status = "Loading $name…", error = null) }
        viewModelScope.launch {
            try {
                val (newModel, newSession) = withContext(Dispatchers.IO) {
                    val m = open()
                    m to PocketSession(m, sessionOptions())
                }
                loaded(name, if (asset) name else null, newModel, newSession, emptyList())
            } catch (e: CancellationException) {
                throw e
            } catch (e: Throwable) {
                // PocketException from the engine or the loaders (including a compressed asset or a
                // revoked URI), and anything else, e.g. UnsatisfiedLinkError for a missing library.
                _state.update { it.copy(loading = false, status = "Pick a model", error = describe(e)) }
            }
        }
    }

    private fun loaded(name: String, asset: String?, newModel: PocketModel, newSession: PocketSession, turns: List<Turn>) {
        session?.destroy()
        model?.destroy()
        model = newModel
        session = newSession
        assetName = asset
        val info = newModel.info()
        val experts = if (info.expertCount > 0u) " · ${info.expertUsedCount}/${info.expertCount} experts" else ""
        _state.update {
            it.copy(
                modelName = name,
                turns = turns,
                loading = false,
                status = "${info.architecture} · ${info.quantization} · ${info.parameterCount / 1_000_000u}M params$experts",
            )
        }
    }

    /**
     * The activity is no longer visible (onStop), after which Android may end
     * the process without notice: stop the answer being written and save the
     * session (the evaluated conversation, so the next launch need not
     * evaluate it again) and the turns. The save waits for the stopped
     * answer's last token and runs on the IO dispatcher; it is not cancelled
     * with the screen. Each file is replaced atomically: a kill mid-save keeps
     * the previous one.
     */
    fun saveForBackground() {
        val session = session ?: return
        val asset = assetName ?: return
        if (_state.value.loading) return
        stop()
        val transcript = JSONObject()
            .put("model", asset)
            .put(
                "turns",
                JSONArray(_state.value.turns.map { JSONObject().put("role", it.role).put("text", it.text) }),
            )
            .toString()
        viewModelScope.launch(Dispatchers.IO + NonCancellable) {
            try {
                session.save(snapshotFile.path)
                val tmp = File(transcriptFile.path + ".tmp")
                tmp.writeText(transcript)
                if (!tmp.renameTo(transcriptFile)) tmp.delete()
            } catch (e: Throwable) {
                // Nothing to show in the background; the next launch starts from the last good save.
                android.util.Log.w("PocketChat", "saving the chat failed", e)
            }
        }
    }

    /**
     * At launch: reopen the last chat's asset model and continue its session
     * from the snapshot. A snapshot that is missing or refused (another model
     * file, damaged) costs only speed: a new session evaluates the turns on the
     * next send.
     */
    private fun restoreLastChat() {
        val saved = try {
            JSONObject(transcriptFile.readText())
        } catch (e: Exception) {
            return // no saved chat (or an unreadable one): start empty
        }
        val asset = saved.optString("model").takeIf { it in _state.value.assetModels } ?: return
        val array = saved.optJSONArray("turns") ?: JSONArray()
        val turns = (0 until array.length()).map {
            val t = array.getJSONObject(it)
            Turn(nextTurnId++, t.getString("role"), t.getString("text"))
        }
        _state.update { it.copy(loading = true, status = "Restoring the last chat…") }
        viewModelScope.launch {
            try {
                val (newModel, newSession) = withContext(Dispatchers.IO) {
                    val m = PocketModel.loadAsset(getApplication<Application>(), asset, loadOptions(assetBytes(asset)))
                    val s = try {
                        PocketSession.restore(m, snapshotFile.path, sessionOptions())
                    } catch (e: PocketException) {
                        android.util.Log.i("PocketChat", "snapshot not used (${e.message}); the turns will be evaluated again")
                        PocketSession(m, sessionOptions())
                    }
                    m to s
                }
                loaded(asset, asset, newModel, newSession, turns)
            } catch (e: CancellationException) {
                throw e
            } catch (e: Throwable) {
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
