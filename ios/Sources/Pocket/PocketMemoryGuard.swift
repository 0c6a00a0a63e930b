// PocketMemoryGuard: a model's memory budget that follows iOS while the model
// runs: memory warnings (UIApplication.didReceiveMemoryWarningNotification),
// the memory-pressure dispatch source, and os_proc_available_memory().
// Hand-written, beside the generated Pocket.swift.

import Dispatch
import Foundation
import os
#if canImport(UIKit)
import UIKit
#endif

/// Keeps a model's memory budget within what iOS lets the app use, while the
/// model runs: on a memory warning or a `.warning` memory-pressure event the
/// budget comes down to what `os_proc_available_memory()` allows (what the
/// model holds now plus what the process may still allocate, less
/// `reserveBytes` for the rest of the app); on a `.critical` event it goes to
/// the model's minimum; when the pressure is back to `.normal`, and on
/// `update()` (call it when the app returns to the foreground), it goes back
/// up, at most to `fullBudgetBytes`. A model loaded without a budget (mapped)
/// takes one when the memory allows less than `fullBudgetBytes` (give it the
/// model's whole size, `minimumBudgetBytes + expertBytes` of its plan). A running generation goes on under the
/// new budget from its next token, its answer unchanged
/// (`PocketModel.setMemoryBudget`).
///
/// Budgets are set on the guard's own queue, never on the main thread (a
/// smaller budget waits for a running token to finish the layer it computes;
/// a model loaded without a budget reads its resident weights when it takes
/// one). `onChange` is told each budget taken, on that queue. The guard stops
/// listening when it is released or `stop()` is called.
///
/// ```swift
/// let model = try PocketModel.load(path: url.path, options: LoadOptions(memoryBudgetBytes: budget))
/// let memoryGuard = PocketMemoryGuard(model: model, fullBudgetBytes: budget)   // keep it as long as the model
/// ```
public final class PocketMemoryGuard: @unchecked Sendable {
    public let model: PocketModel
    /// Room left for the rest of the app (its UI, images, the session's
    /// own growth) when the budget is taken from the available memory.
    public let reserveBytes: UInt64
    /// The model's least budget (`memoryPlan(budgetBytes: 0).minimumBudgetBytes`).
    public let minimumBudgetBytes: UInt64

    private let queue = DispatchQueue(label: "dev.pocket.memory-guard", qos: .utility)
    private let lock = NSLock()
    private var full: UInt64
    private let onChange: (@Sendable (UInt64) -> Void)?
    private let pressure: DispatchSourceMemoryPressure
    private var observer: NSObjectProtocol?
    private static let log = Logger(subsystem: "dev.pocket", category: "memory")

    /// Starts listening at once. `fullBudgetBytes` is what the model may have
    /// when nothing presses (the budget the app chose at load, say).
    public init(
        model: PocketModel,
        fullBudgetBytes: UInt64,
        reserveBytes: UInt64 = 512 << 20,
        onChange: (@Sendable (UInt64) -> Void)? = nil
    ) {
        self.model = model
        self.reserveBytes = reserveBytes
        self.minimumBudgetBytes = model.memoryPlan(budgetBytes: 0).minimumBudgetBytes
        self.full = fullBudgetBytes
        self.onChange = onChange

        pressure = DispatchSource.makeMemoryPressureSource(eventMask: [.normal, .warning, .critical], queue: queue)
        pressure.setEventHandler { [weak self] in
            guard let self else { return }
            let event = self.pressure.data
            if event.contains(.critical) {
                self.apply(self.minimumBudgetBytes)
            } else if event.contains(.warning) {
                self.follow(lowerOnly: true)
            } else if event.contains(.normal) {
                self.follow(lowerOnly: false)
            }
        }
        pressure.resume()

        #if canImport(UIKit) && !os(watchOS)
        observer = NotificationCenter.default.addObserver(
            forName: UIApplication.didReceiveMemoryWarningNotification, object: nil, queue: nil
        ) { [weak self] _ in
            guard let self else { return }
            self.queue.async { self.follow(lowerOnly: true) }
        }
        #endif
    }

    deinit {
        stop()
    }

    /// What the model may have when nothing presses.
    public var fullBudgetBytes: UInt64 {
        get {
            lock.lock()
            defer { lock.unlock() }
            return full
        }
        set {
            lock.lock()
            defer { lock.unlock() }
            full = newValue
        }
    }

    /// Stop listening (the budget stays where it is). Idempotent.
    public func stop() {
        pressure.cancel()
        lock.lock()
        let observer = self.observer
        self.observer = nil
        lock.unlock()
        if let observer {
            NotificationCenter.default.removeObserver(observer)
        }
    }

    /// Follow the available memory now, up or down (on the guard's queue):
    /// call it when the app returns to the foreground.
    public func update() {
        queue.async { self.follow(lowerOnly: false) }
    }

    /// What the process may still allocate before iOS kills it
    /// (`os_proc_available_memory()`); `nil` where that does not exist (macOS).
    public static func availableMemory() -> UInt64? {
        #if os(iOS) && !targetEnvironment(macCatalyst)
        return UInt64(os_proc_available_memory())
        #else
        return nil
        #endif
    }

    /// The budget the available memory allows now: what the model holds plus
    /// what the process may still allocate, less `reserveBytes`, between the
    /// model's minimum and `fullBudgetBytes` (the full budget where the
    /// available memory cannot be read).
    public func budgetNow() -> UInt64 {
        let full = max(fullBudgetBytes, minimumBudgetBytes)
        guard let available = Self.availableMemory() else { return full }
        let u = model.memoryUsage()
        let held = u.residentWeightsBytes + u.expertCacheBytes + u.kvCacheBytes + u.scratchBytes
        let room = held + available
        let budget = room > reserveBytes ? room - reserveBytes : 0
        return min(max(budget, minimumBudgetBytes), full)
    }

    /// On the queue: the budget the memory allows, only if lower than the
    /// present one when `lowerOnly` (a warning never raises it). A model
    /// without a budget (mapped) takes one only when the memory allows less
    /// than `fullBudgetBytes`.
    private func follow(lowerOnly: Bool) {
        let target = budgetNow()
        let current = model.memoryBudgetBytes()
        if current == 0 && target >= max(fullBudgetBytes, minimumBudgetBytes) {
            return
        }
        if lowerOnly && current != 0 && target >= current {
            return
        }
        apply(target)
    }

    private func apply(_ budget: UInt64) {
        dispatchPrecondition(condition: .onQueue(queue))
        let current = model.memoryBudgetBytes()
        guard budget != current else { return }
        do {
            try model.setMemoryBudget(budgetBytes: budget)
            Self.log.info("memory budget \(current) -> \(budget) bytes")
            onChange?(budget)
        } catch {
            Self.log.error("memory budget \(budget) bytes not taken: \(String(describing: error), privacy: .public)")
        }
    }
}
