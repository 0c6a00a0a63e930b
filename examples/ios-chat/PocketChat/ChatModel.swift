import Foundation
import os
import Observation
import Pocket
import UIKit

struct Turn: Identifiable, Equatable {
    let id = UUID()
    let role: String
    var text: String
    /// An assistant turn's tool calls: shown, and sent back with the results.
    var toolCalls: [ToolCall] = []
    /// A tool result (role "tool"): the call it answers.
    var toolCallId: String? = nil

    var message: ChatMessage {
        ChatMessage(role: role, content: text, toolCalls: toolCalls, toolCallId: toolCallId)
    }
}

/// The one tool the app implements: the device's clock. The model sees the
/// name, the description and the JSON Schema of the arguments; a call it
/// makes is run by `runTool` and the result goes back as a "tool" message.
let clockTool = ToolSpec(
    name: "get_time",
    description: "The current date and time on this device",
    parametersJson: #"""
        {"type": "object",
         "properties": {"zone": {"type": "string", "enum": ["local", "UTC"], "description": "local: the device's time zone"}},
         "required": ["zone"], "additionalProperties": false}
        """#
)

/// Runs a call of `clockTool`: the result as JSON.
func runTool(_ call: ToolCall) -> String {
    struct Arguments: Decodable { let zone: String }
    guard call.name == clockTool.name else { return #"{"error": "unknown tool"}"# }
    let zone = (try? JSONDecoder().decode(Arguments.self, from: Data(call.argumentsJson.utf8)))?.zone ?? "local"
    let formatter = ISO8601DateFormatter()
    let timeZone = zone == "UTC" ? TimeZone(identifier: "UTC") : TimeZone.current
    formatter.timeZone = timeZone ?? TimeZone.current
    let result = ["time": formatter.string(from: Date()), "zone": formatter.timeZone.identifier]
    return (try? JSONEncoder().encode(result)).flatMap { String(data: $0, encoding: .utf8) } ?? "{}"
}

/// A structured answer: the conversation summarised into a typed value. The
/// answer is constrained to `summarySchema` token by token and decoded with
/// JSONDecoder (`session.respond(to:generating:schema:)`).
struct Summary: Decodable {
    let topic: String
    let mood: String
    let followUps: [String]
}

private let summarySchema = #"""
    {"type": "object",
     "properties": {
       "topic": {"type": "string", "maxLength": 80},
       "mood": {"type": "string", "enum": ["positive", "neutral", "negative"]},
       "followUps": {"type": "array", "items": {"type": "string", "maxLength": 80}, "maxItems": 3}},
     "required": ["topic", "mood", "followUps"], "additionalProperties": false}
    """#

/// What the app keeps across launches beside the session snapshot: which
/// model (a file in the bundle, Documents or Application Support/Models,
/// found again by name) and the turns as shown. The snapshot holds the
/// evaluated state; if it is missing or refused, the turns are still shown
/// and evaluated again on the next send.
private struct SavedChat: Codable {
    struct SavedCall: Codable {
        let id: String
        let name: String
        let arguments: String
    }
    struct SavedTurn: Codable {
        let role: String
        let text: String
        // Optional: transcripts saved before tools decode too.
        var toolCalls: [SavedCall]? = nil
        var toolCallId: String? = nil
    }
    let model: String
    let turns: [SavedTurn]
}

/// The options of every session: a restored session must have the same
/// context length and KV type as the saved one. A sliding window: long chats
/// keep going instead of failing with ContextFull.
private func sessionOptions() -> SessionOptions {
    SessionOptions(contextLength: 4096, slidingWindow: true)
}

/// Application Support/PocketChat: the snapshot and the transcript.
private let saveFolder: URL = {
    let base = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
        ?? FileManager.default.temporaryDirectory
    return base.appendingPathComponent("PocketChat", isDirectory: true)
}()
private let snapshotURL = saveFolder.appendingPathComponent("chat.snapshot")
private let transcriptURL = saveFolder.appendingPathComponent("chat.json")

/// The model, the session and the conversation; streams answers into `turns`.
@MainActor
@Observable
final class ChatModel {
    /// .gguf files in the app bundle, in its Documents folder (filled through
    /// Finder / the Files app) and in Application Support/Models (downloaded).
    private(set) var available: [URL] = []
    /// The catalog's models not downloaded yet: offered as Download buttons.
    private(set) var downloadable: [CatalogModel] = []
    private(set) var modelName: String?
    private(set) var turns: [Turn] = []
    private(set) var isGenerating = false
    private(set) var isLoading = false
    private(set) var status = "Pick a model"
    var errorText: String?

    private var session: PocketSession?
    private var generation: Task<Void, Never>?
    /// A file picked outside the sandbox stays accessible while its model is loaded.
    private var scopedURL: URL?
    /// The loaded model's file, when it can be found again at the next launch
    /// (bundle, Documents or Models; not a file picked elsewhere, whose access ends with the app).
    private var reopenableModel: URL?
    /// Follows iOS's memory warnings and pressure with the model's memory
    /// budget while it runs (see PocketMemoryGuard).
    private var memoryGuard: PocketMemoryGuard?

    /// A catalog model being downloaded, or stopped with its partial file kept.
    struct Download: Equatable {
        let model: CatalogModel
        var doneBytes: UInt64 = 0
        /// 0 until the server gave the size.
        var totalBytes: UInt64 = 0
        /// False once cancelled, failed or stopped by the background: starting
        /// the same download again continues from the partial file.
        var isRunning = true
    }
    /// Shown as a progress bar with Cancel (running) or Resume (stopped).
    private(set) var download: Download?
    /// Reads the download's stream; nil once it has ended (only one at a time:
    /// two writers to the same partial file would spoil it).
    private var downloadTask: Task<Void, Never>?
    /// The download the background stopped, started again once the app is active.
    private var resumeWhenActive: CatalogModel?
    private var isActive = true

    init() {
        refreshAvailable()
        restoreLastChat()
    }

    func refreshAvailable() {
        var urls = Bundle.main.urls(forResourcesWithExtension: "gguf", subdirectory: nil) ?? []
        let docs = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask).first
        for folder in [docs, modelsFolder].compactMap({ $0 }) {
            // By extension: a download's FILE.gguf.part and .part.meta are not listed.
            if let files = try? FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil) {
                urls += files.filter { $0.pathExtension == "gguf" }
            }
        }
        available = urls.sorted { $0.lastPathComponent < $1.lastPathComponent }
        downloadable = modelCatalog.filter { !$0.isDownloaded }
    }

    /// A memory budget when the file is larger than what this process may
    /// still allocate (80 % of `os_proc_available_memory()`, the rest left
    /// to the app): the model then keeps the weights every token reads in
    /// memory and reads routed experts from flash into a cache of the rest.
    /// Smaller files are mapped as they are. See ios/README.md.
    nonisolated static func loadOptions(for url: URL) -> LoadOptions {
        let fileBytes = UInt64((try? url.resourceValues(forKeys: [.fileSizeKey]).fileSize) ?? 0)
        let budget = UInt64(os_proc_available_memory()) / 10 * 8
        guard budget > 0, fileBytes > budget,
              let plan = try? PocketModel.memoryPlan(path: url.path, budgetBytes: 0),
              budget >= plan.minimumBudgetBytes
        else { return LoadOptions() }
        return LoadOptions(memoryBudgetBytes: budget)
    }

    /// Load a model (mapped, not copied: milliseconds even for multi-GB files).
    /// A running answer is stopped first, and Send stays disabled until the
    /// load ends: the load replaces the session and clears the turns.
    func load(_ url: URL, securityScoped: Bool = false) {
        stop()
        isLoading = true
        errorText = nil
        status = "Loading \(url.lastPathComponent)…"
        // A file picked outside the sandbox is readable between start and stop; true means a stop is owed.
        let accessing = securityScoped && url.startAccessingSecurityScopedResource()
        Task.detached(priority: .userInitiated) {
            do {
                let model = try PocketModel.load(url: url, options: ChatModel.loadOptions(for: url))
                let session = try PocketSession(model: model, options: sessionOptions())
                let info = model.info()
                await self.loaded(url: url, accessing: accessing, model: model, session: session, info: info, turns: [])
            } catch {
                // Nothing keeps the file open: give the access back.
                if accessing {
                    url.stopAccessingSecurityScopedResource()
                }
                await self.failed(error)
            }
        }
    }

    private func loaded(
        url: URL, accessing: Bool, model: PocketModel, session: PocketSession, info: ModelInfo, turns: [Turn]
    ) {
        scopedURL?.stopAccessingSecurityScopedResource()
        scopedURL = accessing ? url : nil
        reopenableModel = accessing ? nil : url
        // The budget chosen at load is the most the model gets; a mapped model
        // (a file smaller than the memory at load) takes a budget when a
        // warning leaves less than all of it.
        let plan = model.memoryPlan(budgetBytes: 0)
        let budget = model.memoryBudgetBytes()
        memoryGuard = PocketMemoryGuard(
            model: model,
            fullBudgetBytes: budget > 0 ? budget : plan.minimumBudgetBytes + plan.expertBytes)
        self.session = session
        modelName = url.deletingPathExtension().lastPathComponent
        self.turns = turns
        isLoading = false
        let experts = info.expertCount > 0 ? " · \(info.expertUsedCount)/\(info.expertCount) experts" : ""
        status = "\(info.architecture) · \(info.quantization) · \(info.parameterCount / 1_000_000)M params\(experts)"
    }

    private func failed(_ error: Error) {
        isLoading = false
        status = "Pick a model"
        errorText = "\(error)"
    }

    // MARK: Downloading a catalog model

    /// Downloads a catalog model into Application Support/Models and loads it
    /// (a new chat). The stream is read in a Task on the main actor, so each
    /// update changes the state directly; the bytes move on the SDK's own
    /// thread. Cancelling the Task cancels the download and keeps the partial
    /// file: calling this again with the same model resumes it.
    func startDownload(_ model: CatalogModel) {
        guard downloadTask == nil else { return }
        errorText = nil
        do {
            try prepareModelsFolder()
        } catch {
            errorText = "Cannot prepare \(modelsFolder.path): \(error)"
            return
        }
        // A resumed download shows its earlier progress until the SDK's first report.
        if download?.model != model {
            download = Download(model: model)
        }
        download?.isRunning = true
        status = "Downloading \(model.name)…"
        downloadTask = Task {
            await runDownload(model)
            downloadTask = nil
            // Back in the foreground before this download had wound down: start it again now.
            if isActive, let again = resumeWhenActive {
                resumeWhenActive = nil
                startDownload(again)
            }
        }
    }

    private func runDownload(_ model: CatalogModel) async {
        do {
            for try await update in downloadModel(request: model.request) {
                switch update {
                case .progress(let done, let total):
                    download?.doneBytes = done
                    download?.totalBytes = total
                    let of = total > 0 ? " of \(megabytes(total))" : ""
                    status = "Downloading \(model.name): \(megabytes(done))\(of)"
                case .finished(let path):
                    download = nil
                    refreshAvailable()
                    load(URL(fileURLWithPath: path))
                    return
                }
            }
            // The stream ended without a file: its Task was cancelled (Cancel, the background).
            downloadStopped(model)
        } catch {
            if Task.isCancelled {
                downloadStopped(model)
            } else {
                download?.isRunning = false
                if case PocketError.Integrity(_) = error {
                    download?.doneBytes = 0 // the SDK deleted the partial file
                }
                status = "\(model.name) not downloaded"
                errorText = describeDownloadFailure(error, of: model)
            }
        }
    }

    private func downloadStopped(_ model: CatalogModel) {
        download?.isRunning = false
        // A file completed just as it was stopped is listed all the same.
        refreshAvailable()
        status = resumeWhenActive == nil
            ? "\(model.name): download stopped; Resume continues it"
            : "\(model.name): download paused in the background; it resumes when the app is active"
    }

    /// The Cancel button: the partial file stays, and Resume continues it.
    func cancelDownload() {
        resumeWhenActive = nil
        downloadTask?.cancel()
    }

    /// The app goes to the background. iOS suspends it within seconds and a
    /// suspended download would only time out: stop it now (the SDK syncs
    /// the partial file within a fraction of a second, and a resume reads
    /// back at most a small part of it) and start it again in `becameActive`.
    /// A download that must go on while the app is suspended belongs to a
    /// background URLSession: ios/README.md ("Downloading the model, also in
    /// the background") shows how to hand it the rest of the partial file and
    /// give the file back to Pocket to verify; this sample keeps to the
    /// foreground.
    func pauseDownloadForBackground() {
        isActive = false
        guard let task = downloadTask, let model = download?.model else { return }
        resumeWhenActive = model
        task.cancel()
    }

    func send(_ text: String) {
        let text = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let session, !isGenerating, !isLoading, !text.isEmpty else { return }
        turns.append(Turn(role: "user", text: text))
        isGenerating = true
        errorText = nil
        generation = Task {
            do {
                // The model may call the clock: run the calls, send the results back
                // (each with its call's id) and let it answer again (at most 3 rounds).
                for _ in 0..<3 {
                    let calls = try await answer(session)
                    if calls.isEmpty || Task.isCancelled { break }
                    for call in calls {
                        turns.append(Turn(role: "tool", text: runTool(call), toolCallId: call.id))
                    }
                }
            } catch {
                if !Task.isCancelled {
                    errorText = "\(error)"
                }
            }
            isGenerating = false
        }
    }

    /// Streams one assistant turn into `turns` (`chatEvents`: text, and the
    /// clock's calls, which are kept in the turn) and returns its calls.
    private func answer(_ session: PocketSession) async throws -> [ToolCall] {
        let messages = turns.map(\.message)
        let reply = Turn(role: "assistant", text: "")
        turns.append(reply)
        var options = GenerateOptions(maxTokens: 512, temperature: 0.7)
        options.tools = [clockTool]
        let stream = session.chatEvents(messages: messages, options: options, onStats: { stats in
            let line = String(
                format: "%.1f tok/s · %d tokens · first token %.0f ms",
                stats.decodeTokensPerSecond, Int(stats.generatedTokens), stats.timeToFirstTokenMs)
            // A load that started meanwhile owns the status line.
            Task { @MainActor in
                if !self.isLoading { self.status = line }
            }
        })
        var calls: [ToolCall] = []
        for try await event in stream {
            // Stopped (Stop, New chat, a load): drop what the stream still holds.
            if Task.isCancelled { return [] }
            // By id, never by position: New chat or a load may have emptied `turns`.
            guard let index = turns.firstIndex(where: { $0.id == reply.id }) else { return [] }
            switch event {
            case .text(let piece):
                turns[index].text += piece
            case .toolCall(let call):
                calls.append(call)
                turns[index].toolCalls.append(call)
            case .reasoning:
                break // thinking is not shown
            }
        }
        return calls
    }

    /// The structured answer: the conversation summarised as a `Summary`
    /// (topic, mood, follow-up questions), shown as a turn.
    func summarize() {
        guard let session, !isGenerating, !isLoading, !turns.isEmpty else { return }
        let request = Turn(role: "user", text: "Summarize our conversation: its topic, its mood, and up to three follow-up questions.")
        turns.append(request)
        let messages = turns.map(\.message)
        isGenerating = true
        errorText = nil
        generation = Task {
            do {
                let summary = try await session.respond(
                    to: messages, generating: Summary.self, schema: summarySchema,
                    options: GenerateOptions(maxTokens: 256, temperature: 0.2))
                let lines = ["Topic: \(summary.topic)", "Mood: \(summary.mood)"] + summary.followUps.map { "• \($0)" }
                if !Task.isCancelled {
                    turns.append(Turn(role: "assistant", text: lines.joined(separator: "\n")))
                }
            } catch {
                if !Task.isCancelled {
                    errorText = "\(error)"
                }
            }
            isGenerating = false
        }
    }

    /// Back in the foreground: the model's budget follows the memory available
    /// now, and a download the background stopped starts again (if its Task
    /// is still winding down, it restarts when that Task ends).
    func becameActive() {
        isActive = true
        memoryGuard?.update()
        if downloadTask == nil, let model = resumeWhenActive {
            resumeWhenActive = nil
            startDownload(model)
        }
    }

    /// The stop button: cancelling the Task ends the stream, which cancels the session.
    func stop() {
        generation?.cancel()
    }

    func newChat() {
        stop()
        turns = []
    }

    /// The app goes to the background, where iOS may end it without notice:
    /// stop the answer being written and save the session (the evaluated
    /// conversation, so the next launch need not evaluate it again) and the
    /// turns. The save waits for the stopped answer's last token, runs off
    /// the main thread, and asks iOS for the time it needs. Each file is
    /// replaced atomically: a kill mid-save keeps the previous one.
    func saveForBackground() {
        guard let session, let model = reopenableModel, !isLoading else { return }
        stop()
        // The turns as they stand; the stopped reply keeps what it had streamed.
        let saved = SavedChat(model: model.lastPathComponent, turns: turns.map { turn in
            SavedChat.SavedTurn(
                role: turn.role, text: turn.text,
                toolCalls: turn.toolCalls.map { SavedChat.SavedCall(id: $0.id, name: $0.name, arguments: $0.argumentsJson) },
                toolCallId: turn.toolCallId)
        })
        var expiring = UIBackgroundTaskIdentifier.invalid
        expiring = UIApplication.shared.beginBackgroundTask(withName: "Save chat") {
            UIApplication.shared.endBackgroundTask(expiring)
        }
        let task = expiring
        Task.detached(priority: .userInitiated) {
            do {
                try FileManager.default.createDirectory(at: saveFolder, withIntermediateDirectories: true)
                try session.save(path: snapshotURL.path)
                try JSONEncoder().encode(saved).write(to: transcriptURL, options: .atomic)
            } catch {
                // Nothing to show in the background; the next launch starts from the last good save.
                NSLog("PocketChat: saving the chat failed: \(error)")
            }
            await MainActor.run { UIApplication.shared.endBackgroundTask(task) }
        }
    }

    /// At launch: reopen the last chat's model and continue its session from
    /// the snapshot. A snapshot that is missing or refused (another model
    /// file, damaged) costs only speed: a new session evaluates the turns on
    /// the next send.
    private func restoreLastChat() {
        guard let data = try? Data(contentsOf: transcriptURL),
              let saved = try? JSONDecoder().decode(SavedChat.self, from: data),
              let url = available.first(where: { $0.lastPathComponent == saved.model })
        else { return }
        isLoading = true
        status = "Restoring the last chat…"
        let turns = saved.turns.map { t in
            Turn(
                role: t.role, text: t.text,
                toolCalls: (t.toolCalls ?? []).map { ToolCall(id: $0.id, name: $0.name, argumentsJson: $0.arguments) },
                toolCallId: t.toolCallId)
        }
        Task.detached(priority: .userInitiated) {
            do {
                let model = try PocketModel.load(url: url, options: ChatModel.loadOptions(for: url))
                let session: PocketSession
                do {
                    session = try PocketSession.restore(model: model, path: snapshotURL.path, options: sessionOptions())
                } catch {
                    NSLog("PocketChat: snapshot not used (\(error)); the turns will be evaluated again")
                    session = try PocketSession(model: model, options: sessionOptions())
                }
                let info = model.info()
                await self.loaded(url: url, accessing: false, model: model, session: session, info: info, turns: turns)
            } catch {
                await self.failed(error)
            }
        }
    }
}
