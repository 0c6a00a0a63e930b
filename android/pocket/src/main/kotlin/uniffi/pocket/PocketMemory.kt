// PocketModel.memoryPlan: how a memory budget divides for a model file, as
// a companion member beside `load` (over the generated top-level `planMemory`).
// Android-free: compiled and tested on the JVM by `cargo xtask test-bindings kotlin`.

package uniffi.pocket

/**
 * How [budgetBytes] would divide for the model at [path], read from its header
 * and tensor table without loading the weights: the bytes kept in memory, the
 * experts left on flash, the smallest budget accepted and what the budget
 * leaves for the expert cache. Pick a budget from `ActivityManager.MemoryInfo`;
 * see android/README.md.
 */
@Throws(PocketException::class)
fun PocketModel.Companion.memoryPlan(path: String, budgetBytes: ULong): MemoryPlan = planMemory(path, budgetBytes)
