// Swift concurrency layer over the generated bindings (Pocket.swift):
// generation as an AsyncThrowingStream that cancels the session when the
// consuming Task is cancelled or stops iterating.

import Foundation

extension PocketSession {
    /// Streams the completion of `prompt` piece by piece.
    ///
    /// Generation runs on its own thread. Cancelling the consuming `Task` (or
    /// leaving the `for try await` loop early) calls `cancel()` on the session;
    /// the engine stops within a token, and a request whose consumer is gone
    /// before its thread runs is not started at all. Engine failures are thrown as
    /// `PocketError`. `onStats` receives the request's figures (tokens/s, stop
    /// reason) when it ends, on the generating thread.
    ///
    ///     for try await piece in session.generateStream(prompt: "Hello") {
    ///         text += piece
    ///     }
    public func generateStream(
        prompt: String,
        options: GenerateOptions = GenerateOptions(),
        onStats: (@Sendable (GenerationStats) -> Void)? = nil
    ) -> AsyncThrowingStream<String, Error> {
        tokenStream(onStats: onStats) { session, listener in
            try session.generate(prompt: prompt, options: options, listener: listener)
        }
    }

    /// Like `generateStream`, answering `messages` through the model's chat template.
    public func chatStream(
        messages: [ChatMessage],
        options: GenerateOptions = GenerateOptions(),
        onStats: (@Sendable (GenerationStats) -> Void)? = nil
    ) -> AsyncThrowingStream<String, Error> {
        tokenStream(onStats: onStats) { session, listener in
            try session.chat(messages: messages, options: options, listener: listener)
        }
    }

    private func tokenStream(
        onStats: (@Sendable (GenerationStats) -> Void)?,
        request: @escaping @Sendable (PocketSession, TokenListener) throws -> GenerationStats
    ) -> AsyncThrowingStream<String, Error> {
        AsyncThrowingStream(bufferingPolicy: .unbounded) { continuation in
            let listener = StreamListener(continuation: continuation)
            // Set once the request returned: a late termination must not cancel a later request.
            let finished = LockedFlag()
            continuation.onTermination = { [self] termination in
                listener.close()
                if case .cancelled = termination, !finished.isSet {
                    self.cancel()
                }
            }
            let worker = Thread { [self] in
                // The consumer may be gone before this thread runs. A cancel() that came before
                // the request does not carry over to it (the session forgets it), so the whole
                // prompt would be prefilled before the closed listener stopped it at the first
                // token: don't start.
                guard listener.isOpen else {
                    finished.set()
                    continuation.finish()
                    return
                }
                do {
                    let stats = try request(self, listener)
                    finished.set()
                    onStats?(stats)
                    continuation.finish()
                } catch {
                    finished.set()
                    continuation.finish(throwing: error)
                }
            }
            // The calling thread takes part in the engine's work: give it a full-size stack.
            worker.stackSize = 8 << 20
            worker.qualityOfService = .userInitiated
            worker.name = "pocket.generate"
            worker.start()
        }
    }
}

extension PocketModel {
    /// Load a model with default options.
    public static func load(path: String) throws -> PocketModel {
        try load(path: path, options: LoadOptions())
    }

    /// Load a model file from a URL (a file in the app bundle or its documents).
    public static func load(url: URL, options: LoadOptions = LoadOptions()) throws -> PocketModel {
        guard url.isFileURL else {
            throw PocketError.InvalidArgument(reason: "\(url) is not a file URL")
        }
        return try load(path: url.path, options: options)
    }
}

/// Forwards pieces to the stream until the consumer goes away.
private final class StreamListener: TokenListener, @unchecked Sendable {
    private let continuation: AsyncThrowingStream<String, Error>.Continuation
    private let open = LockedFlag(true)

    init(continuation: AsyncThrowingStream<String, Error>.Continuation) {
        self.continuation = continuation
    }

    /// False once the stream has terminated (consumer cancelled, loop left, or finished).
    var isOpen: Bool {
        open.isSet
    }

    func close() {
        open.clear()
    }

    func onToken(piece: String) throws -> Bool {
        guard open.isSet else { return false }
        if case .terminated = continuation.yield(piece) {
            return false
        }
        return true
    }
}

/// A Bool shared between threads.
private final class LockedFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Bool

    init(_ value: Bool = false) {
        self.value = value
    }

    var isSet: Bool {
        lock.lock()
        defer { lock.unlock() }
        return value
    }

    func set() {
        lock.lock()
        value = true
        lock.unlock()
    }

    func clear() {
        lock.lock()
        value = false
        lock.unlock()
    }
}
