// PocketMemoryTrimmer: a model's memory budget that follows Android's memory signals
// (ComponentCallbacks2.onTrimMemory and onLowMemory), and comes back when the app returns.
// The Android shell only; the level-to-budget mapping is memoryBudgetForTrimLevel in
// PocketMemory.kt, which the JVM tests cover.

package uniffi.pocket

import android.app.ActivityManager
import android.content.ComponentCallbacks2
import android.content.Context
import android.content.res.Configuration
import android.util.Log
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors

/**
 * Registers itself with the application context and sets [model]'s memory budget on
 * `onTrimMemory` (see [memoryBudgetForTrimLevel]; a trim never raises the budget, and a model
 * loaded without one takes one on any level but `UI_HIDDEN`) and `onLowMemory` (the minimum). Call
 * [restore] when the app comes back to the foreground (an activity's `onStart`): the budget
 * returns towards [fullBudgetBytes] as far as `ActivityManager.MemoryInfo` allows
 * ([memoryBudgetFromAvailable], keeping [reserveBytes] for the rest of the app).
 *
 * Budgets are set on a thread of its own (a budget change waits for a running token to finish
 * the layer it computes; a model loaded without a budget reads its resident weights when it
 * takes one), never on the main thread; a running generation goes on, its answer unchanged.
 * [onChange] is told each budget taken, on that thread. [close] unregisters.
 */
class PocketMemoryTrimmer(
    context: Context,
    private val model: PocketModel,
    @Volatile var fullBudgetBytes: ULong,
    private val reserveBytes: ULong = 512uL shl 20,
    private val onChange: ((ULong) -> Unit)? = null,
) : ComponentCallbacks2, AutoCloseable {
    private val app: Context = context.applicationContext
    private val minimum: ULong = model.memoryPlan(0uL).minimumBudgetBytes
    private val executor: ExecutorService = Executors.newSingleThreadExecutor { r ->
        Thread(r, "pocket-memory").apply { isDaemon = true }
    }
    @Volatile
    private var closed = false

    init {
        app.registerComponentCallbacks(this)
    }

    override fun onTrimMemory(level: Int) {
        val budget = memoryBudgetForTrimLevel(level, fullBudgetBytes, minimum)
        // A trim only ever lowers the budget; restore() raises it. A mapped model (no budget)
        // takes one under memory pressure, not merely because the UI was hidden.
        set { current ->
            when {
                current == 0uL -> if (level == TrimLevel.UI_HIDDEN) null else budget
                budget < current -> budget
                else -> null
            }
        }
    }

    @Deprecated("Deprecated in Java")
    override fun onLowMemory() {
        set { minimum }
    }

    override fun onConfigurationChanged(newConfig: Configuration) {}

    /**
     * Back towards the full budget, as far as the system's free memory allows now. A model
     * without a budget (mapped) takes one only when the memory allows less than the full budget.
     */
    fun restore() {
        set { current ->
            val am = app.getSystemService(ActivityManager::class.java)
            val info = ActivityManager.MemoryInfo().also { am.getMemoryInfo(it) }
            val budget = memoryBudgetFromAvailable(
                model.memoryUsage().totalBytes, info.availMem, info.threshold,
                reserveBytes, fullBudgetBytes, minimum,
            )
            if (current == 0uL && budget >= fullBudgetBytes) null else budget
        }
    }

    /** On the trimmer's thread: the budget [choose] picks from the current one (null: keep it). */
    private fun set(choose: (ULong) -> ULong?) {
        if (closed) return
        executor.execute {
            if (closed) return@execute
            try {
                val current = model.memoryBudgetBytes()
                val budget = choose(current)?.coerceAtLeast(minimum) ?: return@execute
                if (budget == current) return@execute
                model.setMemoryBudget(budget)
                onChange?.invoke(budget)
            } catch (e: Exception) {
                // PocketException (refused), or the model destroyed meanwhile: the budget stays.
                Log.w("Pocket", "memory budget not changed: ${e.message}")
            }
        }
    }

    /** Unregister; a change under way finishes. Call it before destroying the model. */
    override fun close() {
        closed = true
        app.unregisterComponentCallbacks(this)
        executor.shutdown()
    }
}
