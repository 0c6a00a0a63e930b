// Swift concurrency layer over the generated bindings (Pocket.swift):
// generation as an AsyncThrowingStream (of text pieces, or of
// GenerationEvents) that cancels the session when the consuming Task is
// cancelled or stops iterating, and typed answers constrained by a JSON Schema.

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
        requestStream(onStats: onStats) { session, sink in
            try session.generate(prompt: prompt, options: options, listener: TokenForwarder(sink))
        }
    }

    /// Like `generateStream`, answering `messages` through the model's chat template.
    public func chatStream(
        messages: [ChatMessage],
        options: GenerateOptions = GenerateOptions(),
        onStats: (@Sendable (GenerationStats) -> Void)? = nil
    ) -> AsyncThrowingStream<String, Error> {
        requestStream(onStats: onStats) { session, sink in
            try session.chat(messages: messages, options: options, listener: TokenForwarder(sink))
        }
    }

    /// Like `chatStream`, reporting every `GenerationEvent` as it happens:
    /// answer text (`.text`), thinking (`.reasoning`) and tool calls
    /// (`.toolCall`, each complete and valid against its tool's schema).
    /// `onStats` receives the figures, `reasoning` and `toolCalls` included.
    ///
    ///     for try await event in session.chatEvents(messages: messages, options: options) {
    ///         switch event {
    ///         case .text(let piece): answer += piece
    ///         case .reasoning(let piece): thought += piece
    ///         case .toolCall(let call): calls.append(call)
    ///         }
    ///     }
    public func chatEvents(
        messages: [ChatMessage],
        options: GenerateOptions = GenerateOptions(),
        onStats: (@Sendable (GenerationStats) -> Void)? = nil
    ) -> AsyncThrowingStream<GenerationEvent, Error> {
        requestStream(onStats: onStats) { session, sink in
            try session.chatEvents(messages: messages, options: options, listener: EventForwarder(sink))
        }
    }

    /// Like `generateStream`, reporting every `GenerationEvent` (see
    /// `chatEvents(messages:options:onStats:)`).
    public func generateEvents(
        prompt: String,
        options: GenerateOptions = GenerateOptions(),
        onStats: (@Sendable (GenerationStats) -> Void)? = nil
    ) -> AsyncThrowingStream<GenerationEvent, Error> {
        requestStream(onStats: onStats) { session, sink in
            try session.generateEvents(prompt: prompt, options: options, listener: EventForwarder(sink))
        }
    }

    /// The answer to `messages` as a `T`, decoded with `JSONDecoder` from JSON
    /// valid against `schema` (a JSON Schema, as text, that describes `T`),
    /// constrained token by token: `options` with `jsonSchema` set to `schema`.
    /// Cancelling the Task cancels the session and throws `CancellationError`.
    /// A schema the engine refuses is `PocketError.InvalidArgument`; an answer
    /// that stopped before its end (`maxTokens` reached, a stop string,
    /// `cancel()` from elsewhere) is `PocketAnswerError.incomplete`.
    ///
    ///     struct Person: Decodable { let name: String; let age: Int }
    ///     let schema = #"""
    ///         {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    ///          "required": ["name", "age"], "additionalProperties": false}
    ///         """#
    ///     let person = try await session.respond(to: messages, generating: Person.self, schema: schema)
    public func respond<T: Decodable>(
        to messages: [ChatMessage],
        generating: T.Type,
        schema: String,
        options: GenerateOptions = GenerateOptions()
    ) async throws -> T {
        var constrained = options
        constrained.jsonSchema = schema
        let stats = StatsHolder()
        var text = ""
        for try await piece in chatStream(messages: messages, options: constrained, onStats: { stats.set($0) }) {
            text += piece
        }
        // A cancelled Task ends the stream without an error.
        try Task.checkCancellation()
        guard let done = stats.value, done.stopReason == .endOfText else {
            throw PocketAnswerError.incomplete(stopReason: stats.value?.stopReason ?? .cancelled, text: text)
        }
        return try JSONDecoder().decode(T.self, from: Data(text.utf8))
    }

    /// One request on its own thread, as a stream: `request` runs the engine
    /// with a listener that forwards each item to `sink` (which refuses them,
    /// so that the engine stops, once the consumer is gone).
    private func requestStream<Element>(
        onStats: (@Sendable (GenerationStats) -> Void)?,
        request: @escaping @Sendable (PocketSession, StreamSink<Element>) throws -> GenerationStats
    ) -> AsyncThrowingStream<Element, Error> {
        AsyncThrowingStream(bufferingPolicy: .unbounded) { continuation in
            let sink = StreamSink(continuation: continuation)
            // Set once the request returned: a late termination must not cancel a later request.
            let finished = LockedFlag()
            continuation.onTermination = { [self] termination in
                sink.close()
                if case .cancelled = termination, !finished.isSet {
                    self.cancel()
                }
            }
            let worker = Thread { [self] in
                // The consumer may be gone before this thread runs. A cancel() that came before
                // the request does not carry over to it (the session forgets it), so the whole
                // prompt would be prefilled before the closed listener stopped it at the first
                // token: don't start.
                guard sink.isOpen else {
                    finished.set()
                    continuation.finish()
                    return
                }
                do {
                    let stats = try request(self, sink)
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

/// A schema-constrained answer that could not be decoded because it did not end.
public enum PocketAnswerError: Error {
    /// The answer stopped (`stopReason`: `.maxTokens`, `.stopString`, `.cancelled`) before
    /// its JSON was complete; `text` is what it had. Raise `maxTokens` for `.maxTokens`.
    case incomplete(stopReason: StopReason, text: String)
}

/// Forwards items to the stream until the consumer goes away.
private final class StreamSink<Element>: @unchecked Sendable {
    private let continuation: AsyncThrowingStream<Element, Error>.Continuation
    private let open = LockedFlag(true)

    init(continuation: AsyncThrowingStream<Element, Error>.Continuation) {
        self.continuation = continuation
    }

    /// False once the stream has terminated (consumer cancelled, loop left, or finished).
    var isOpen: Bool {
        open.isSet
    }

    func close() {
        open.clear()
    }

    /// Yields `item`; false (the listener then stops the engine) once the consumer is gone.
    func send(_ item: Element) -> Bool {
        guard open.isSet else { return false }
        if case .terminated = continuation.yield(item) {
            return false
        }
        return true
    }
}

/// The `TokenListener` of a text stream.
private final class TokenForwarder: TokenListener, @unchecked Sendable {
    private let sink: StreamSink<String>

    init(_ sink: StreamSink<String>) {
        self.sink = sink
    }

    func onToken(piece: String) throws -> Bool {
        sink.send(piece)
    }
}

/// The `EventListener` of an event stream.
private final class EventForwarder: EventListener, @unchecked Sendable {
    private let sink: StreamSink<GenerationEvent>

    init(_ sink: StreamSink<GenerationEvent>) {
        self.sink = sink
    }

    func onEvent(event: GenerationEvent) throws -> Bool {
        sink.send(event)
    }
}

/// A request's figures, set on the generating thread and read once its stream has ended.
private final class StatsHolder: @unchecked Sendable {
    private let lock = NSLock()
    private var stats: GenerationStats?

    var value: GenerationStats? {
        lock.lock()
        defer { lock.unlock() }
        return stats
    }

    func set(_ value: GenerationStats) {
        lock.lock()
        stats = value
        lock.unlock()
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
