// Swift concurrency layer over `downloadModel` (Pocket.swift): a model
// download as an AsyncThrowingStream of progress that ends with the file's
// path, and cancels the download when the consuming Task is cancelled.

import Foundation

/// Where a model download stands.
public enum DownloadUpdate: Sendable, Equatable {
    /// Bytes on disk of all parts, and their total (0 until the server says).
    case progress(doneBytes: UInt64, totalBytes: UInt64)
    /// Every part verified and in place: the file to load (of several parts, the first).
    case finished(path: String)
}

extension DownloadRequest {
    /// One file with its expected SHA-256 (64 hex digits), saved at `destination`.
    public init(url: String, sha256: String, destination: URL) {
        self.init(urls: [url], sha256: [sha256], destination: destination.path, allowUnverified: false)
    }

    /// The shards of one model (one URL and one SHA-256 each), saved under
    /// their URLs' file names in `folder`; load the first.
    public init(urls: [String], sha256: [String], folder: URL) {
        self.init(urls: urls, sha256: sha256, destination: folder.path + "/", allowUnverified: false)
    }
}

/// Downloads `request` (resumable, verified) and streams its progress,
/// ending with `.finished(path:)`. Failures are thrown as `PocketError`
/// (`.Network`, `.Integrity`, `.Storage`, `.InvalidArgument`). Cancelling the
/// consuming Task (or leaving the loop early) cancels the download; its
/// partial file stays, and the same request later resumes it.
///
///     let request = DownloadRequest(url: "hf://org/repo/model-Q4_K_M.gguf", sha256: expected,
///                                   destination: modelsFolder.appendingPathComponent("model.gguf"))
///     for try await update in downloadModel(request: request) {
///         switch update {
///         case .progress(let done, let total): progress = total > 0 ? Double(done) / Double(total) : 0
///         case .finished(let path): model = try PocketModel.load(path: path)
///         }
///     }
public func downloadModel(request: DownloadRequest) -> AsyncThrowingStream<DownloadUpdate, Error> {
    AsyncThrowingStream(bufferingPolicy: .unbounded) { continuation in
        let holder = HandleHolder()
        continuation.onTermination = { termination in
            if case .cancelled = termination {
                holder.cancel()
            }
        }
        do {
            holder.set(try downloadModel(request: request, listener: DownloadForwarder(continuation)))
        } catch {
            continuation.finish(throwing: error)
        }
    }
}

/// The listener that feeds the stream (on the download's thread).
private final class DownloadForwarder: DownloadListener, @unchecked Sendable {
    private let continuation: AsyncThrowingStream<DownloadUpdate, Error>.Continuation

    init(_ continuation: AsyncThrowingStream<DownloadUpdate, Error>.Continuation) {
        self.continuation = continuation
    }

    func onProgress(doneBytes: UInt64, totalBytes: UInt64) {
        continuation.yield(.progress(doneBytes: doneBytes, totalBytes: totalBytes))
    }

    func onFinished(path: String) {
        continuation.yield(.finished(path: path))
        continuation.finish()
    }

    func onFailed(error: PocketError) {
        continuation.finish(throwing: error)
    }
}

/// The handle, once `downloadModel` returned it; a cancel that came first is applied then.
private final class HandleHolder: @unchecked Sendable {
    private let lock = NSLock()
    private var handle: DownloadHandle?
    private var cancelled = false

    func set(_ h: DownloadHandle) {
        lock.lock()
        handle = h
        let cancelNow = cancelled
        lock.unlock()
        if cancelNow {
            h.cancel()
        }
    }

    func cancel() {
        lock.lock()
        cancelled = true
        let h = handle
        lock.unlock()
        h?.cancel()
    }
}
