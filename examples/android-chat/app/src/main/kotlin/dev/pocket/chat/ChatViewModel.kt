package dev.pocket.chat

import android.app.ActivityManager
import android.app.Application
import android.net.Uri
import androidx.lifecycle.AndroidViewModel
import androidx.lifecycle.viewModelScope
import java.io.File
import java.text.SimpleDateFormat
import java.util.Date
import java.util.Locale
import java.util.TimeZone
import kotlin.coroutines.cancellation.CancellationException
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.flowOn
import kotlinx.coroutines.flow.update
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import org.json.JSONArray
import org.json.JSONObject
import uniffi.pocket.ChatMessage
import uniffi.pocket.DownloadUpdate
import uniffi.pocket.GenerateOptions
import uniffi.pocket.GenerationEvent
import uniffi.pocket.LoadOptions
import uniffi.pocket.PocketException
import uniffi.pocket.PocketMemoryTrimmer
import uniffi.pocket.PocketModel
import uniffi.pocket.PocketSession
import uniffi.pocket.SessionOptions
import uniffi.pocket.ToolCall
import uniffi.pocket.ToolSpec
import uniffi.pocket.chatEventsFlow
import uniffi.pocket.downloadModelFlow
import uniffi.pocket.loadAsset
import uniffi.pocket.loadFile
import uniffi.pocket.loadUri
import uniffi.pocket.respond

/**
 * One message; [id] finds a reply again after other turns came and went. An
 * assistant turn keeps its [toolCalls] (shown, and sent back with the
 * results); a tool result (role "tool") names the call it answers in [toolCallId].
 */
data class Turn(
    val id: Long,
    val role: String,
    val text: String,
    val toolCalls: List<ToolCall> = emptyList(),
    val toolCallId: String? = null,
) {
    fun message() = ChatMessage(role = role, content = text, toolCalls = toolCalls, toolCallId = toolCallId)
}

/**
 * The one tool the app implements: the device's clock. The model sees the
 * name, the description and the JSON Schema of the arguments; a call it makes
 * is run by [runTool] and the result goes back as a "tool" message.
 */
private val clockTool = ToolSpec(
    name = "get_time",
    description = "The current date and time on this device",
    parametersJson = """{"type":"object","properties":{"zone":{"type":"string","enum":["local","UTC"],""" +
        """"description":"local: the device's time zone"}},"required":["zone"],"additionalProperties":false}""",
)

/** Runs a call of [clockTool]: the result as JSON. */
private fun runTool(call: ToolCall): String {
    if (call.name != clockTool.name) return """{"error":"unknown tool"}"""
    val zone = runCatching { JSONObject(call.argumentsJson).getString("zone") }.getOrDefault("local")
    val timeZone = if (zone == "UTC") TimeZone.getTimeZone("UTC") else TimeZone.getDefault()
    val format = SimpleDateFormat("yyyy-MM-dd'T'HH:mm:ssZ", Locale.US).apply { this.timeZone = timeZone }
    return JSONObject().put("time", format.format(Date())).put("zone", timeZone.id).toString()
}

/**
 * A structured answer: the conversation summarised into a typed value. The
 * answer is constrained to [SUMMARY_SCHEMA] token by token
 * (`session.respond`), and decoded with Android's org.json (the AAR has no
 * JSON library of its own).
 */
data class Summary(val topic: String, val mood: String, val followUps: List<String>)

private const val SUMMARY_SCHEMA = """{"type":"object","properties":{
    "topic":{"type":"string","maxLength":80},
    "mood":{"type":"string","enum":["positive","neutral","negative"]},
    "followUps":{"type":"array","items":{"type":"string","maxLength":80},"maxItems":3}},
  "required":["topic","mood","followUps"],"additionalProperties":false}"""

/** A catalog model being downloaded, or stopped with its partial file kept. */
data class DownloadState(
    val model: CatalogModel,
    val doneBytes: Long = 0,
    /** 0 until the server gave the size. */
    val totalBytes: Long = 0,
    /**
     * False once cancelled or failed: starting the same download again
     * continues from the partial file.
     */
    val running: Boolean = true,
) {
    /** 0.0 to 1.0 (0.0 while the total is unknown). */
    val fraction: Float get() = if (totalBytes > 0) (doneBytes.toFloat() / totalBytes).coerceIn(0f, 1f) else 0f
}

data class ChatState(
    val assetModels: List<String> = emptyList(),
    /** .gguf files downloaded into filesDir/models. */
    val downloadedModels: List<String> = emptyList(),
    /** The catalog's models not downloaded yet: offered as Download buttons. */
    val downloadable: List<CatalogModel> = emptyList(),
    /** Shown as a progress bar with Cancel (running) or Resume (stopped). */
    val download: DownloadState? = null,
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

/**
 * A model file the next launch can open again: an APK asset, or a download in
 * filesDir/models (a picked URI is not: its permission ends with the process).
 */
private data class SavedModel(val name: String, val downloaded: Boolean)

/** Holds the model and the session; streams answers into [state]. */
class ChatViewModel(app: Application) : AndroidViewModel(app) {
    private val _state = MutableStateFlow(ChatState(assetModels = listAssetModels()))
    val state: StateFlow<ChatState> = _state

    private var model: PocketModel? = null
    /** Follows onTrimMemory with the model's memory budget (see PocketMemoryTrimmer). */
    private var trimmer: PocketMemoryTrimmer? = null
    private var session: PocketSession? = null
    private var generation: Job? = null
    private var nextTurnId = 0L
    /** The loaded model, when the next launch can open it again. */
    private var reopenable: SavedModel? = null
    /** Collects the catalog download; one at a time (two writers would spoil its partial file). */
    private var downloadJob: Job? = null

    /** The session snapshot and the transcript (which model, the turns as shown). */
    private val snapshotFile get() = File(getApplication<Application>().filesDir, "chat.snapshot")
    private val transcriptFile get() = File(getApplication<Application>().filesDir, "chat.json")
    /** Downloaded models: app-private, not backed up (the manifest's allowBackup is false). */
    private val modelsDir get() = File(getApplication<Application>().filesDir, "models")

    init {
        refreshDownloaded()
        restoreLastChat()
    }

    private fun listAssetModels(): List<String> =
        getApplication<Application>().assets.list("")?.filter { it.endsWith(".gguf") }?.sorted() ?: emptyList()

    /**
     * Lists filesDir/models (by extension: a download's FILE.gguf.part and
     * .part.meta are not listed) and what the catalog still offers.
     */
    private fun refreshDownloaded() {
        val files = modelsDir.list()?.filter { it.endsWith(".gguf") }?.sorted() ?: emptyList()
        _state.update { st ->
            st.copy(downloadedModels = files, downloadable = modelCatalog.filter { it.fileName !in files })
        }
    }

    /** A model shipped uncompressed in the APK's assets, mapped in place. */
    fun loadAsset(name: String) = loadSaved(SavedModel(name, downloaded = false))

    /** A model downloaded into filesDir/models, mapped in place. */
    fun loadDownloaded(name: String) = loadSaved(SavedModel(name, downloaded = true))

    private fun loadSaved(model: SavedModel) = load(model.name, model) { openModel(model) }

    /** An asset or a downloaded file, with a memory budget if it needs one. */
    private fun openModel(model: SavedModel): PocketModel =
        if (model.downloaded) {
            val file = File(modelsDir, model.name)
            PocketModel.loadFile(file.path, loadOptions(file.length()))
        } else {
            PocketModel.loadAsset(getApplication<Application>(), model.name, loadOptions(assetBytes(model.name)))
        }

    /** A model the user picked in the system file picker. */
    fun loadUri(uri: Uri) = load(uri.lastPathSegment?.substringAfterLast('/') ?: "model", reopen = null) {
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
    private fun load(name: String, reopen: SavedModel?, open: () -> PocketModel) {
        stop()
        _state.update { it.copy(loading = true, status = "Loading $name…", error = null) }
        viewModelScope.launch {
            try {
                val (newModel, newSession) = withContext(Dispatchers.IO) {
                    val m = open()
                    m to PocketSession(m, sessionOptions())
                }
                loaded(name, reopen, newModel, newSession, emptyList())
            } catch (e: CancellationException) {
                throw e
            } catch (e: Throwable) {
                // PocketException from the engine or the loaders (including a compressed asset or a
                // revoked URI), and anything else, e.g. UnsatisfiedLinkError for a missing library.
                _state.update { it.copy(loading = false, status = "Pick a model", error = describe(e)) }
            }
        }
    }

    private fun loaded(name: String, reopen: SavedModel?, newModel: PocketModel, newSession: PocketSession, turns: List<Turn>) {
        trimmer?.close()
        session?.destroy()
        model?.destroy()
        model = newModel
        // The budget chosen at load is the most the model gets; a mapped model (a file smaller
        // than the memory at load) takes a budget when the system starts trimming.
        val plan = newModel.memoryPlan(0uL)
        val budget = newModel.memoryBudgetBytes()
        trimmer = PocketMemoryTrimmer(
            getApplication(), newModel,
            fullBudgetBytes = if (budget > 0uL) budget else plan.minimumBudgetBytes + plan.expertBytes,
        )
        session = newSession
        reopenable = reopen
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
     * Downloads a catalog model into filesDir/models and loads it (a new
     * chat). The flow is collected on viewModelScope (the main thread: each
     * update is a state change); its start (the request's checks, the partial
     * file) runs on Dispatchers.IO and the bytes move on the SDK's own thread.
     * The ViewModel keeps it going across rotations and while the process
     * lives. Cancelling the collector cancels the download and keeps the
     * partial file, so calling this again resumes it, also after process death
     * (the user taps Download again). A download that must go on in the
     * background, across process death, belongs to WorkManager:
     * android/README.md ("Downloading the model, also in the background")
     * shows the worker.
     */
    fun startDownload(model: CatalogModel) {
        // Not while the previous collector still winds down.
        if (downloadJob?.isCompleted == false) return
        // A resumed download shows its earlier progress until the SDK's first report.
        val resumed = _state.value.download?.takeIf { it.model == model } ?: DownloadState(model)
        _state.update { it.copy(download = resumed.copy(running = true), error = null, status = "Downloading ${model.name}…") }
        downloadJob = viewModelScope.launch {
            try {
                downloadModelFlow(model.request(modelsDir))
                    .flowOn(Dispatchers.IO)
                    .collect { u ->
                        when (u) {
                            is DownloadUpdate.Progress -> {
                                val done = u.doneBytes.toLong()
                                val total = u.totalBytes.toLong()
                                val of = if (total > 0) " of ${megabytes(total)}" else ""
                                _state.update {
                                    it.copy(
                                        download = it.download?.copy(doneBytes = done, totalBytes = total),
                                        status = "Downloading ${model.name}: ${megabytes(done)}$of",
                                    )
                                }
                            }
                            is DownloadUpdate.Finished -> {
                                _state.update { it.copy(download = null) }
                                refreshDownloaded()
                                loadDownloaded(File(u.path).name)
                            }
                        }
                    }
            } catch (e: CancellationException) {
                // Cancel (or the ViewModel cleared): the SDK keeps the partial file.
                _state.update {
                    it.copy(
                        download = it.download?.copy(running = false),
                        status = "${model.name}: download stopped; Resume continues it",
                    )
                }
                throw e
            } catch (e: Throwable) {
                _state.update {
                    val kept = if (e is PocketException.Integrity) 0L else it.download?.doneBytes ?: 0L
                    it.copy(
                        download = it.download?.copy(running = false, doneBytes = kept),
                        status = "${model.name} not downloaded",
                        error = describeDownloadFailure(e, model),
                    )
                }
            }
        }
    }

    /** The Cancel button: the partial file stays, and Resume continues it. */
    fun cancelDownload() {
        downloadJob?.cancel()
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
        val saved = reopenable ?: return
        if (_state.value.loading) return
        stop()
        val transcript = JSONObject()
            .put("model", saved.name)
            .put("source", if (saved.downloaded) "download" else "asset")
            .put(
                "turns",
                JSONArray(
                    _state.value.turns.map { turn ->
                        JSONObject().put("role", turn.role).put("text", turn.text)
                            .put("toolCallId", turn.toolCallId)
                            .put(
                                "toolCalls",
                                JSONArray(
                                    turn.toolCalls.map {
                                        JSONObject().put("id", it.id).put("name", it.name).put("arguments", it.argumentsJson)
                                    },
                                ),
                            )
                    },
                ),
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
     * At launch: reopen the last chat's model (an asset or a download) and
     * continue its session from the snapshot. A snapshot that is missing or refused (another model
     * file, damaged) costs only speed: a new session evaluates the turns on the
     * next send.
     */
    private fun restoreLastChat() {
        val saved = try {
            JSONObject(transcriptFile.readText())
        } catch (e: Exception) {
            return // no saved chat (or an unreadable one): start empty
        }
        // Transcripts saved before downloads have no "source": their model is an asset.
        val model = SavedModel(saved.optString("model"), downloaded = saved.optString("source") == "download")
        val present = if (model.downloaded) _state.value.downloadedModels else _state.value.assetModels
        if (model.name !in present) return
        val array = saved.optJSONArray("turns") ?: JSONArray()
        val turns = (0 until array.length()).map {
            val t = array.getJSONObject(it)
            // Transcripts saved before tools have neither field.
            val calls = t.optJSONArray("toolCalls") ?: JSONArray()
            Turn(
                nextTurnId++,
                t.getString("role"),
                t.getString("text"),
                toolCalls = (0 until calls.length()).map { i ->
                    val c = calls.getJSONObject(i)
                    ToolCall(id = c.getString("id"), name = c.getString("name"), argumentsJson = c.getString("arguments"))
                },
                toolCallId = if (t.has("toolCallId")) t.getString("toolCallId") else null,
            )
        }
        _state.update { it.copy(loading = true, status = "Restoring the last chat…") }
        viewModelScope.launch {
            try {
                val (newModel, newSession) = withContext(Dispatchers.IO) {
                    val m = openModel(model)
                    val s = try {
                        PocketSession.restore(m, snapshotFile.path, sessionOptions())
                    } catch (e: PocketException) {
                        android.util.Log.i("PocketChat", "snapshot not used (${e.message}); the turns will be evaluated again")
                        PocketSession(m, sessionOptions())
                    }
                    m to s
                }
                loaded(model.name, model, newModel, newSession, turns)
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
        _state.update { it.copy(turns = it.turns + Turn(nextTurnId++, "user", text.trim()), generating = true, error = null) }
        generation = viewModelScope.launch {
            try {
                // The model may call the clock: run the calls, send the results back (each
                // with its call's id) and let it answer again (at most 3 rounds).
                for (round in 0 until 3) {
                    val calls = answer(session)
                    if (calls.isEmpty()) break
                    val results = calls.map { Turn(nextTurnId++, "tool", runTool(it), toolCallId = it.id) }
                    _state.update { it.copy(turns = it.turns + results) }
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

    /**
     * Streams one assistant turn into the state (`chatEventsFlow`: text, and the
     * clock's calls, which are kept in the turn) and returns its calls.
     */
    private suspend fun answer(session: PocketSession): List<ToolCall> {
        val history = _state.value.turns
        val reply = Turn(nextTurnId++, "assistant", "")
        _state.update { it.copy(turns = it.turns + reply) }
        val calls = mutableListOf<ToolCall>()
        val options = GenerateOptions(maxTokens = 512u, temperature = 0.7f, tools = listOf(clockTool))
        session.chatEventsFlow(history.map { it.message() }, options) { stats ->
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
        }.collect { event ->
            when (event) {
                is GenerationEvent.Text -> updateTurn(reply.id) { it.copy(text = it.text + event.piece) }
                is GenerationEvent.ToolCall -> {
                    calls += event.call
                    updateTurn(reply.id) { it.copy(toolCalls = it.toolCalls + event.call) }
                }
                is GenerationEvent.Reasoning -> {} // thinking is not shown
            }
        }
        // "New chat" or a load removed the reply meanwhile: its calls belong to no conversation.
        return if (_state.value.turns.any { it.id == reply.id }) calls else emptyList()
    }

    /** By id: "New chat" or a load may have removed the turn meanwhile. */
    private fun updateTurn(id: Long, change: (Turn) -> Turn) {
        _state.update { st -> st.copy(turns = st.turns.map { if (it.id == id) change(it) else it }) }
    }

    /**
     * The structured answer: the conversation summarised as a [Summary] (topic,
     * mood, follow-up questions), shown as a turn.
     */
    fun summarize() {
        val session = session ?: return
        if (_state.value.generating || _state.value.loading || _state.value.turns.isEmpty()) return
        val request = Turn(nextTurnId++, "user", "Summarize our conversation: its topic, its mood, and up to three follow-up questions.")
        val history = _state.value.turns + request
        _state.update { it.copy(turns = history, generating = true, error = null) }
        generation = viewModelScope.launch {
            try {
                val options = GenerateOptions(maxTokens = 256u, temperature = 0.2f)
                val summary = session.respond(history.map { it.message() }, SUMMARY_SCHEMA, options) { json ->
                    val o = JSONObject(json)
                    val followUps = o.getJSONArray("followUps")
                    Summary(o.getString("topic"), o.getString("mood"), (0 until followUps.length()).map { followUps.getString(it) })
                }
                val text = (listOf("Topic: ${summary.topic}", "Mood: ${summary.mood}") + summary.followUps.map { "• $it" })
                    .joinToString("\n")
                _state.update { it.copy(turns = it.turns + Turn(nextTurnId++, "assistant", text)) }
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

    /** Back in the foreground: the model's budget follows the memory available now. */
    fun onForeground() {
        trimmer?.restore()
    }

    override fun onCleared() {
        trimmer?.close()
        generation?.cancel()
        // UniFFI frees the Rust objects once in-flight calls have returned.
        session?.destroy()
        model?.destroy()
    }
}
