import Foundation
import Observation
import Pocket

struct Turn: Identifiable, Equatable {
    let id = UUID()
    let role: String
    var text: String
}

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

    init() {
        refreshAvailable()
    }

    func refreshAvailable() {
        var urls = Bundle.main.urls(forResourcesWithExtension: "gguf", subdirectory: nil) ?? []
        if let docs = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask).first,
           let files = try? FileManager.default.contentsOfDirectory(at: docs, includingPropertiesForKeys: nil) {
            urls += files.filter { $0.pathExtension == "gguf" }
        }
        available = urls.sorted { $0.lastPathComponent < $1.lastPathComponent }
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
                let model = try PocketModel.load(url: url)
                // A sliding window: long chats keep going instead of failing with ContextFull.
                let session = try PocketSession(model: model, options: SessionOptions(contextLength: 4096, slidingWindow: true))
                let info = model.info()
                await self.loaded(url: url, accessing: accessing, session: session, info: info)
            } catch {
                // Nothing keeps the file open: give the access back.
                if accessing {
                    url.stopAccessingSecurityScopedResource()
                }
                await self.failed(error)
            }
        }
    }

    private func loaded(url: URL, accessing: Bool, session: PocketSession, info: ModelInfo) {
        scopedURL?.stopAccessingSecurityScopedResource()
        scopedURL = accessing ? url : nil
        self.session = session
        modelName = url.deletingPathExtension().lastPathComponent
        turns = []
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
}
