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

// ---- following the OS: budgets for memory signals (Android-free, so the JVM tests cover them;
// PocketMemoryTrimmer in PocketTrimMemory.kt feeds them ComponentCallbacks2's levels) ----------

/** `ComponentCallbacks2.TRIM_MEMORY_*` (the values are Android's, fixed since API 14). */
object TrimLevel {
    const val RUNNING_MODERATE = 5
    const val RUNNING_LOW = 10
    const val RUNNING_CRITICAL = 15
    const val UI_HIDDEN = 20
    const val BACKGROUND = 40
    const val MODERATE = 60
    const val COMPLETE = 80
}

/**
 * The memory budget for an `onTrimMemory(level)`, between [minimumBudget] (the model's
 * `memoryPlan(..).minimumBudgetBytes`: the least it runs in, short of unloading it) and
 * [fullBudget] (what the app gives the model when nothing presses). The more the system
 * presses, the closer to the minimum:
 *
 * - `RUNNING_MODERATE` (still running, the system starts to be short): half the room above the minimum;
 * - `RUNNING_LOW`: a quarter; `RUNNING_CRITICAL`: the minimum (the system kills background apps next);
 * - `UI_HIDDEN` (the app went to the background): half; `BACKGROUND` (in the LRU list): a quarter;
 * - `MODERATE` and `COMPLETE` (the app is among the next to be killed): the minimum;
 * - any other level: the full budget.
 *
 * Android 14 (API 34) sends only `UI_HIDDEN` and `BACKGROUND`; earlier versions all of them.
 */
fun memoryBudgetForTrimLevel(level: Int, fullBudget: ULong, minimumBudget: ULong): ULong {
    if (fullBudget <= minimumBudget) return minimumBudget
    val room = fullBudget - minimumBudget
    return when {
        level >= TrimLevel.MODERATE -> minimumBudget
        level >= TrimLevel.BACKGROUND -> minimumBudget + room / 4uL
        level >= TrimLevel.UI_HIDDEN -> minimumBudget + room / 2uL
        level >= TrimLevel.RUNNING_CRITICAL -> minimumBudget
        level >= TrimLevel.RUNNING_LOW -> minimumBudget + room / 4uL
        level >= TrimLevel.RUNNING_MODERATE -> minimumBudget + room / 2uL
        else -> fullBudget
    }
}

/**
 * The budget the system's free memory allows now, from `ActivityManager.MemoryInfo`: what the
 * model holds ([heldBytes], the sum of `memoryUsage()`) plus what the system can give before
 * its low-memory killer starts ([availMem] less [threshold]), less [reserveBytes] for the rest
 * of the app; at most [fullBudget], at least [minimumBudget].
 */
fun memoryBudgetFromAvailable(
    heldBytes: ULong,
    availMem: Long,
    threshold: Long,
    reserveBytes: ULong,
    fullBudget: ULong,
    minimumBudget: ULong,
): ULong {
    val free = (availMem - threshold).coerceAtLeast(0L).toULong()
    val room = heldBytes + free
    val budget = if (room > reserveBytes) room - reserveBytes else 0uL
    return budget.coerceAtMost(fullBudget).coerceAtLeast(minimumBudget)
}

/** Everything [MemoryUsage] counts. */
val MemoryUsage.totalBytes: ULong
    get() = residentWeightsBytes + expertCacheBytes + kvCacheBytes + scratchBytes
