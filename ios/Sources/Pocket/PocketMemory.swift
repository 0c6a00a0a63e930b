// PocketModel.memoryPlan: how a memory budget divides for a model file, as
// a static member beside `load` (the generated module-level `planMemory`).

extension PocketModel {
    /// How `budgetBytes` would divide for the model at `path`, read from its
    /// header and tensor table without loading the weights: the bytes kept
    /// in memory, the experts left on flash, the smallest budget accepted and
    /// what the budget leaves for the expert cache. Pick a budget from
    /// `os_proc_available_memory()`; see ios/README.md.
    public static func memoryPlan(path: String, budgetBytes: UInt64) throws -> MemoryPlan {
        try planMemory(path: path, budgetBytes: budgetBytes)
    }
}
