import Foundation
import os
import Observation
import Pocket
import UIKit

struct Turn: Identifiable, Equatable {
    let id = UUID()
    let role: String
    var text: String
}

/// What the app keeps across launches beside the session snapshot: which
/// model (a file in the bundle or Documents, found again by name) and the
/// turns as shown. The snapshot holds the evaluated state; if it is missing
/// or refused, the turns are still shown and evaluated again on the next send.
private struct SavedChat: Codable {
    struct SavedTurn: Codable {
        let role: String
        let text: String
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
    /// .gguf files in the app bundle and in its Documents folder (filled through Finder / the Files app).
    private(set) var available: [URL] = []
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
    /// (bundle or Documents; not a file picked elsewhere, whose access ends with the app).
    private var reopenableModel: URL?

    init() {
        refreshAvailable()
        restoreLastChat()
    }

    func refreshAvailable() {
        var urls = Bundle.main.urls(forResourcesWithExtension: "gguf", subdirectory: nil) ?? []
        if let docs = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask).first,
           let files = try? FileManager.default.contentsOfDirectory(at: docs, includingPropertiesForKeys: nil) {
            urls += files.filter { $0.pathExtension == "gguf" }
        }
        available = urls.sorted { $0.lastPathComponent < $1.lastPathComponent }
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
                await self.loaded(url: url, accessing: accessing, session: session, info: info, turns: [])
            } catch {
                // Nothing keeps the file open: give the access back.
                if accessing {
                    url.stopAccessingSecurityScopedResource()
                }
                await self.failed(error)
            }
        }
    }

    private func loaded(url: URL, accessing: Bool, session: PocketSession, info: ModelInfo, turns: [Turn]) {
        scopedURL?.stopAccessingSecurityScopedResource()
        scopedURL = accessing ? url : nil
        reopenableModel = accessing ? nil : url
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

    func send(_ text: String) {
        let text = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let session, !isGenerating, !isLoading, !text.isEmpty else { return }
        turns.append(Turn(role: "user", text: text))
        let messages = turns.map { ChatMessage(role: $0.role, content: $0.text) }
        let reply = Turn(role: "assistant", text: "")
        turns.append(reply)
        isGenerating = true
        errorText = nil
        generation = Task {
            let stream = session.chatStream(
                messages: messages,
                options: GenerateOptions(maxTokens: 512, temperature: 0.7),
                onStats: { stats in
                    let line = String(
                        format: "%.1f tok/s · %d tokens · first token %.0f ms",
                        stats.decodeTokensPerSecond, Int(stats.generatedTokens), stats.timeToFirstTokenMs)
                    // A load that started meanwhile owns the status line.
                    Task { @MainActor in
                        if !self.isLoading { self.status = line }
                    }
                })
            do {
                for try await piece in stream {
                    // Stopped (Stop, New chat, a load): drop what the stream still holds.
                    if Task.isCancelled { break }
                    // By id, never by position: New chat or a load may have emptied `turns`.
                    guard let index = turns.firstIndex(where: { $0.id == reply.id }) else { break }
                    turns[index].text += piece
                }
            } catch {
                if !Task.isCancelled {
                    errorText = "\(error)"
                }
            }
            isGenerating = false
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
        let saved = SavedChat(model: model.lastPathComponent, turns: turns.map { .init(role: $0.role, text: $0.text) })
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
        let turns = saved.turns.map { Turn(role: $0.role, text: $0.text) }
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
                await self.loaded(url: url, accessing: false, session: session, info: info, turns: turns)
            } catch {
                await self.failed(error)
            }
        }
    }
}
