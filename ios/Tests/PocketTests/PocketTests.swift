// The Swift package against the real library (macOS host slice of the
// XCFramework): run on a Mac with `cargo xtask xcframework && swift test`.
// The same cases as the Python and Kotlin suites, plus the AsyncThrowingStream layer.

import Foundation
import XCTest

@testable import Pocket

/// Collects pieces; stops after `limit` of them.
final class Collect: TokenListener, @unchecked Sendable {
    private let lock = NSLock()
    private var pieces: [String] = []
    private let limit: Int

    init(limit: Int = .max) { self.limit = limit }

    var all: [String] { lock.lock(); defer { lock.unlock() }; return pieces }
    var text: String { all.joined() }

    func onToken(piece: String) throws -> Bool {
        lock.lock(); defer { lock.unlock() }
        pieces.append(piece)
        return pieces.count < limit
    }
}

final class PocketTests: XCTestCase {
    static let fixtures: URL = {
        if let dir = ProcessInfo.processInfo.environment["POCKET_FIXTURES"] {
            return URL(fileURLWithPath: dir)
        }
        // ios/Tests/PocketTests/PocketTests.swift -> repository root -> ../shared/fixtures
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.deletingLastPathComponent().appendingPathComponent("shared/fixtures")
    }()

    static let moePath = fixtures.appendingPathComponent("models/qwen3moe-tiny-Q4_K_M.gguf").path
    static let moe: PocketModel = try! PocketModel.load(path: moePath, options: LoadOptions())

    func greedy(_ n: UInt32) -> GenerateOptions { GenerateOptions(maxTokens: n, temperature: 0) }
    func session(_ options: SessionOptions = SessionOptions()) throws -> PocketSession {
        try PocketSession(model: Self.moe, options: options)
    }

    func testInfo() throws {
        let info = Self.moe.info()
        XCTAssertEqual(info.architecture, "qwen3moe")
        XCTAssertEqual(info.expertCount, 8)
        XCTAssertEqual(info.expertUsedCount, 2)
        XCTAssertEqual(info.quantization, "Q4_K_M")
        XCTAssertGreaterThan(info.parameterCount, 1_000_000)
    }

    func testStreamingAndStats() throws {
        let listener = Collect()
        let stats = try session().generate(prompt: "The quick brown fox", options: greedy(12), listener: listener)
        XCTAssertTrue([.maxTokens, .endOfText].contains(stats.stopReason))
        XCTAssertEqual(listener.text, stats.text)
        XCTAssertGreaterThan(stats.decodeTokensPerSecond, 0)
    }

    func testListenerStop() throws {
        let listener = Collect(limit: 3)
        let stats = try session().generate(prompt: "Hello", options: greedy(50), listener: listener)
        XCTAssertEqual(stats.stopReason, .listenerStopped)
        XCTAssertEqual(listener.all.count, 3)
    }

    func testCancelFromAnotherThread() throws {
        let s = try session()
        let started = DispatchSemaphore(value: 0)
        let done = expectation(description: "generation ended")
        let result = StatsBox()
        DispatchQueue.global().async {
            let listener = Signal(started)
            result.value = try? s.generate(prompt: "Hello", options: GenerateOptions(maxTokens: 3000, temperature: 1), listener: listener)
            done.fulfill()
        }
        XCTAssertEqual(started.wait(timeout: .now() + 30), .success)
        s.cancel()
        wait(for: [done], timeout: 30)
        XCTAssertEqual(result.value?.stopReason, .cancelled)
    }

    func testBadFilesThrow() throws {
        let junk = FileManager.default.temporaryDirectory.appendingPathComponent("junk.gguf")
        try Data("this is not a model".utf8).write(to: junk)
        XCTAssertThrowsError(try PocketModel.load(path: junk.path)) { error in
            guard case PocketError.InvalidModel(let reason) = error else { return XCTFail("\(error)") }
            XCTAssertTrue(reason.contains("GGUF"))
        }
        XCTAssertThrowsError(try PocketModel.load(path: "/nonexistent.gguf")) { error in
            guard case PocketError.Io = error else { return XCTFail("\(error)") }
        }
    }

    func testGenerationAfterErrors() throws {
        let s = try session()
        let first = try s.generate(prompt: "Hello world", options: greedy(6), listener: Collect()).text
        XCTAssertThrowsError(try s.chat(messages: [ChatMessage(role: "robot", content: "beep")], options: greedy(6), listener: Collect()))
        XCTAssertEqual(try s.generate(prompt: "Hello world", options: greedy(6), listener: Collect()).text, first)
    }

    func testChat() throws {
        let s = try session()
        let stats = try s.chat(messages: [ChatMessage(role: "user", content: "Hi!")], options: greedy(8), listener: Collect())
        XCTAssertGreaterThan(stats.generatedTokens, 0)
    }

    func testLoadFromFd() throws {
        let fd = open(Self.moePath, O_RDONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        let size = try FileManager.default.attributesOfItem(atPath: Self.moePath)[.size] as! UInt64
        let model = try PocketModel.loadFromFd(fd: fd, offset: 0, length: size, options: LoadOptions())
        close(fd)
        XCTAssertEqual(model.info(), Self.moe.info())
    }

    func testGenerateStream() async throws {
        let expected = try session().generate(prompt: "Hello", options: greedy(10), listener: Collect()).text
        var text = ""
        for try await piece in try session().generateStream(prompt: "Hello", options: greedy(10)) {
            text += piece
        }
        XCTAssertEqual(text, expected)
    }

    func testCancellingTheTaskCancelsTheSession() async throws {
        let s = try session()
        let stats = StatsBox()
        let task = Task {
            var n = 0
            for try await _ in s.generateStream(prompt: "Hello", options: GenerateOptions(maxTokens: 3000, temperature: 1), onStats: { stats.value = $0 }) {
                n += 1
            }
            return n
        }
        try await Task.sleep(nanoseconds: 50_000_000)
        task.cancel()
        _ = try? await task.value
        // The session is free again within a token, and the request ended early.
        XCTAssertEqual(try s.generate(prompt: "Hi", options: greedy(4), listener: Collect()).generatedTokens, 4)
        XCTAssertNotEqual(stats.value?.stopReason, .maxTokens)
    }

    func testStreamErrorsAreThrown() async throws {
        do {
            for try await _ in try session().chatStream(messages: [], options: greedy(4)) {}
            XCTFail("no error")
        } catch PocketError.InvalidArgument {
        }
    }
}

/// Signals on the first piece, then slows generation down a little.
final class Signal: TokenListener, @unchecked Sendable {
    private let semaphore: DispatchSemaphore
    private var first = true

    init(_ semaphore: DispatchSemaphore) { self.semaphore = semaphore }

    func onToken(piece: String) throws -> Bool {
        if first {
            first = false
            semaphore.signal()
        }
        Thread.sleep(forTimeInterval: 0.005)
        return true
    }
}

final class StatsBox: @unchecked Sendable {
    private let lock = NSLock()
    private var stats: GenerationStats?
    var value: GenerationStats? {
        get { lock.lock(); defer { lock.unlock() }; return stats }
        set { lock.lock(); stats = newValue; lock.unlock() }
    }
}
