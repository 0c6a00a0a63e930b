// The Kotlin bindings on the JVM against the host library (JNA), the
// Flow layer, and the Android helpers' descriptor checks and error mapping
// (PocketDescriptors.kt): load, info, streaming, listener stop, cancel from
// another thread, errors, generation after an error, chat, loadFromFd.
// Structured output (schemas, events, tools) is in StructuredTest.kt.
// Run by `cargo xtask test-bindings kotlin`; a tiny runner, no JUnit needed.

import com.sun.jna.Library
import com.sun.jna.Native
import java.io.File
import java.io.FileNotFoundException
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicReference
import kotlin.concurrent.thread
import kotlin.system.exitProcess
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.delay
import kotlinx.coroutines.flow.take
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import uniffi.pocket.*

// ---- a minimal runner ------------------------------------------------------------------

private val tests = mutableListOf<Pair<String, () -> Unit>>()

internal fun test(name: String, body: () -> Unit) {
    tests += name to body
}

internal fun expect(condition: Boolean, what: () -> String) {
    if (!condition) throw AssertionError(what())
}

internal inline fun <reified E : Throwable> expectThrows(block: () -> Unit): E {
    try {
        block()
    } catch (e: Throwable) {
        if (e is E) return e
        throw AssertionError("expected ${E::class.simpleName}, got $e", e)
    }
    throw AssertionError("expected ${E::class.simpleName}, nothing was thrown")
}

// ---- helpers ---------------------------------------------------------------------------------

/** libc through JNA: a raw descriptor, as an app gets from an AssetFileDescriptor. */
private interface LibC : Library {
    fun open(path: String, flags: Int): Int
    fun close(fd: Int): Int
}

private val libc: LibC = Native.load("c", LibC::class.java)

internal class Collect(val limit: Int = Int.MAX_VALUE, val each: (String) -> Unit = {}) : TokenListener {
    val pieces = java.util.Collections.synchronizedList(mutableListOf<String>())
    val text get() = pieces.joinToString("")
    override fun onToken(piece: String): Boolean {
        pieces += piece
        each(piece)
        return pieces.size < limit
    }
}

private val fixtures = File(System.getenv("POCKET_FIXTURES") ?: "../shared/fixtures")
internal fun fixtureModel(name: String): String {
    val f = File(fixtures, "models/$name")
    require(f.isFile) { "fixture model $f is missing (set POCKET_FIXTURES)" }
    return f.path
}

internal fun greedy(maxTokens: UInt) = GenerateOptions(maxTokens = maxTokens, temperature = 0f)

fun main() {
    val moePath = fixtureModel("qwen3moe-tiny-Q4_K_M.gguf")
    val moe = PocketModel.load(moePath, LoadOptions())
    fun newSession(options: SessionOptions = SessionOptions()) = PocketSession(moe, options)

    test("info of a MoE model") {
        val info = moe.info()
        expect(info.architecture == "qwen3moe") { "architecture ${info.architecture}" }
        expect(info.expertCount == 8u && info.expertUsedCount == 2u) { "experts $info" }
        expect(info.quantization == "Q4_K_M") { info.quantization }
        expect(info.fileBytes == File(moePath).length().toULong()) { "fileBytes ${info.fileBytes}" }
        expect(info.parameterCount > 1_000_000uL && info.contextLength > 0u) { "$info" }
        expect(info.backend == Backend.CPU && info.adapter == null) { "backend ${info.backend}, adapter ${info.adapter}" }
    }

    test("backend: Auto and Cpu run on the CPU; Gpu names its adapter or is UnsupportedModel") {
        for (backend in listOf(Backend.AUTO, Backend.CPU)) {
            val info = PocketModel.load(moePath, LoadOptions(backend = backend)).info()
            expect(info.backend == Backend.CPU && info.adapter == null) { "$backend: $info" }
        }
        try {
            val info = PocketModel.load(moePath, LoadOptions(backend = Backend.GPU)).info()
            val adapter = info.adapter
            expect(info.backend == Backend.GPU && adapter != null && adapter.name.isNotEmpty()) { "$info" }
        } catch (e: PocketException.UnsupportedModel) {
            expect(e.reason.contains("GPU unavailable")) { e.reason }
        }
    }

    test("a memory budget: the plan, the refusal below the minimum, the same text") {
        val plan = PocketModel.memoryPlan(moePath, 0uL)
        expect(plan.expertBytes > 0uL && plan.residentBytes > 0uL && plan.cacheBytes == 0uL) { "$plan" }
        try {
            PocketModel.load(moePath, LoadOptions(memoryBudgetBytes = plan.minimumBudgetBytes - 1uL))
            throw AssertionError("a budget below the minimum loaded")
        } catch (e: PocketException.OutOfMemory) {
            expect(e.reason.contains(plan.minimumBudgetBytes.toString())) { e.reason }
        }
        val small = PocketModel.load(moePath, LoadOptions(memoryBudgetBytes = plan.minimumBudgetBytes))
        val opts = GenerateOptions(maxTokens = 8u, temperature = 0f)
        val want = PocketSession(moe, SessionOptions()).generate("Once upon a time", opts, Collect())
        val got = PocketSession(small, SessionOptions()).generate("Once upon a time", opts, Collect())
        expect(got.text == want.text) { "${got.text} vs ${want.text}" }
        expect(got.expertCacheMisses > 0uL && got.storageBytesRead > 0uL) { "$got" }
    }

    test("setMemoryBudget mid-answer from another thread: the same text; memoryUsage follows") {
        val plan = PocketModel.memoryPlan(moePath, 0uL)
        val min = plan.minimumBudgetBytes
        val opts = GenerateOptions(maxTokens = 16u, temperature = 0f)
        val want = PocketSession(moe, SessionOptions()).generate("Once upon a time", opts, Collect())
        val model = PocketModel.load(moePath, LoadOptions())
        // Each piece, another thread sets the next budget while this one waits:
        // from none, shrink, grow, to the mapping, from none again.
        val budgets = listOf(min + plan.expertBytes / 2uL, min, min + plan.expertBytes, 0uL, min)
        val seen = mutableListOf<Pair<ULong, MemoryUsage>>()
        var pieces = 0
        val listener = object : TokenListener {
            override fun onToken(piece: String): Boolean {
                if (pieces < budgets.size) {
                    val b = budgets[pieces]
                    val t = thread {
                        model.setMemoryBudget(b)
                        synchronized(seen) { seen += b to model.memoryUsage() }
                    }
                    t.join()
                }
                pieces++
                return true
            }
        }
        val got = PocketSession(model, SessionOptions()).generate("Once upon a time", opts, listener)
        expect(got.text == want.text) { "${got.text} vs ${want.text}" }
        expect(seen.size == minOf(budgets.size, pieces)) { "$seen" }
        for ((b, usage) in seen) {
            expect(usage.kvCacheBytes > 0uL && usage.scratchBytes > 0uL) { "$usage" }
            if (b == 0uL) {
                expect(usage.expertCacheBytes == 0uL) { "$usage" }
            } else {
                expect(usage.residentWeightsBytes == plan.residentBytes) { "$usage" }
                expect(usage.expertCacheBytes <= model.memoryPlan(b).cacheBytes) { "$b: $usage" }
            }
        }
        val refused = expectThrows<PocketException.InvalidArgument> { model.setMemoryBudget(min - 1uL) }
        expect(refused.reason.contains(min.toString())) { refused.reason }
        expect(model.memoryBudgetBytes() == seen.last().first) { "${model.memoryBudgetBytes()}" }
    }

    test("trim levels map to budgets between the minimum and the full budget") {
        val (min, full) = 1000uL to 2000uL
        expect(memoryBudgetForTrimLevel(0, full, min) == full) { "no pressure" }
        expect(memoryBudgetForTrimLevel(TrimLevel.RUNNING_MODERATE, full, min) == 1500uL) { "moderate" }
        expect(memoryBudgetForTrimLevel(TrimLevel.RUNNING_LOW, full, min) == 1250uL) { "low" }
        expect(memoryBudgetForTrimLevel(TrimLevel.RUNNING_CRITICAL, full, min) == min) { "critical" }
        expect(memoryBudgetForTrimLevel(TrimLevel.UI_HIDDEN, full, min) == 1500uL) { "hidden" }
        expect(memoryBudgetForTrimLevel(TrimLevel.BACKGROUND, full, min) == 1250uL) { "background" }
        expect(memoryBudgetForTrimLevel(TrimLevel.MODERATE, full, min) == min) { "moderate (LRU)" }
        expect(memoryBudgetForTrimLevel(TrimLevel.COMPLETE, full, min) == min) { "complete" }
        expect(memoryBudgetForTrimLevel(TrimLevel.COMPLETE, 500uL, min) == min) { "full below the minimum" }
        // availMem 3000 less threshold 1000, plus 400 held, less 600 reserved: 1800.
        expect(memoryBudgetFromAvailable(400uL, 3000L, 1000L, 600uL, full, min) == 1800uL) { "available" }
        expect(memoryBudgetFromAvailable(400uL, 9000L, 1000L, 600uL, full, min) == full) { "capped" }
        expect(memoryBudgetFromAvailable(0uL, 500L, 1000L, 600uL, full, min) == min) { "floored" }
    }

    test("info of a dense model") {
        val info = PocketModel.load(fixtureModel("gemma3-tiny-Q8_0.gguf"), LoadOptions()).info()
        expect(info.architecture == "gemma3" && info.expertCount == 0u) { "$info" }
    }

    test("defaults") {
        val l = LoadOptions()
        expect(l.threads == 0u && l.useMmap && l.progress == null && l.backend == null) { "$l" }
        val s = SessionOptions()
        expect(s.contextLength == 0u && s.kvCacheType == null && !s.slidingWindow && s.threads == 0u) { "$s" }
        val g = GenerateOptions()
        expect(g.maxTokens == 256u && g.stop.isEmpty() && g.seed == null && g.topK == 40u) { "$g" }
    }

    test("streaming pieces and stats") {
        val listener = Collect()
        val stats = newSession().generate("The quick brown fox", greedy(12u), listener)
        expect(stats.stopReason == StopReason.MAX_TOKENS || stats.stopReason == StopReason.END_OF_TEXT) { "$stats" }
        expect(stats.generatedTokens in 1u..12u && stats.promptTokens >= 4u) { "$stats" }
        expect(listener.text == stats.text && listener.pieces.isNotEmpty()) { "pieces ${listener.pieces} vs ${stats.text}" }
        expect(stats.timeToFirstTokenMs > 0.0 && stats.decodeTokensPerSecond > 0.0) { "$stats" }
    }

    test("greedy is deterministic; F16 and F32 caches agree on the tiny model") {
        val a = newSession().generate("Once upon a time", greedy(10u), Collect()).text
        val b = newSession(SessionOptions(kvCacheType = KvCacheType.F32)).generate("Once upon a time", greedy(10u), Collect()).text
        expect(a == b) { "'$a' vs '$b'" }
    }

    test("listener stop") {
        val listener = Collect(limit = 3)
        val stats = newSession().generate("Hello", greedy(50u), listener)
        expect(stats.stopReason == StopReason.LISTENER_STOPPED && listener.pieces.size == 3) { "$stats" }
    }

    test("stop strings") {
        val full = newSession().generate("Tell me", greedy(24u), Collect()).text
        val stop = full.substring(full.length / 2).take(3)
        val stats = newSession().generate("Tell me", greedy(24u).copy(stop = listOf(stop)), Collect())
        expect(stats.stopReason == StopReason.STOP_STRING && stats.text == full.substring(0, full.indexOf(stop))) { "$stats" }
    }

    test("cancel from another thread") {
        val session = newSession()
        val started = CountDownLatch(1)
        val result = AtomicReference<Any>()
        val worker = thread {
            result.set(
                runCatching {
                    session.generate("Hello", GenerateOptions(maxTokens = 3000u, temperature = 1f), Collect { started.countDown(); Thread.sleep(5) })
                }.getOrElse { it },
            )
        }
        expect(started.await(30, TimeUnit.SECONDS)) { "no token within 30 s" }
        session.cancel()
        worker.join(30_000)
        val stats = result.get() as GenerationStats
        expect(stats.stopReason == StopReason.CANCELLED && stats.generatedTokens < 3000u) { "$stats" }
    }

    test("a cancel before a request does not stick") {
        val session = newSession()
        session.cancel()
        expect(session.generate("Hello", greedy(5u), Collect()).stopReason != StopReason.CANCELLED) { "cancelled" }
    }

    test("bad files throw PocketException") {
        val junk = File.createTempFile("junk", ".gguf").apply { writeText("this is not a model".repeat(10)); deleteOnExit() }
        val e = expectThrows<PocketException.InvalidModel> { PocketModel.load(junk.path, LoadOptions()) }
        expect(e.reason.contains("GGUF")) { e.reason }
        expectThrows<PocketException.Io> { PocketModel.load("/nonexistent/model.gguf", LoadOptions()) }
        expectThrows<PocketException.InvalidArgument> { PocketModel.loadFromFd(-1, 0uL, 10uL, LoadOptions()) }
    }

    test("generation after errors still works") {
        val session = newSession()
        val first = session.generate("Hello world", greedy(6u), Collect()).text
        expectThrows<PocketException.InvalidArgument> {
            session.chat(listOf(ChatMessage(role = "robot", content = "beep")), greedy(6u), Collect())
        }
        expectThrows<PocketException.InvalidArgument> { session.generate("Hi", GenerateOptions(temperature = -1f), Collect()) }
        val thrown = expectThrows<PocketException.Internal> {
            session.generate("Hello world", greedy(6u), object : TokenListener {
                override fun onToken(piece: String): Boolean = throw IllegalStateException("listener bug")
            })
        }
        expect(thrown.reason.contains("listener bug")) { thrown.reason }
        val again = session.generate("Hello world", greedy(6u), Collect()).text
        expect(again == first) { "'$again' vs '$first'" }
    }

    test("context full, and the sliding window") {
        val small = newSession(SessionOptions(contextLength = 32u))
        expectThrows<PocketException.ContextFull> { small.generate("Hello", greedy(64u), Collect()) }
        val sliding = newSession(SessionOptions(contextLength = 32u, slidingWindow = true))
        val stats = sliding.generate("Hello", greedy(64u), Collect())
        expect(stats.generatedTokens == 64u || stats.stopReason == StopReason.END_OF_TEXT) { "$stats" }
    }

    test("chat turns") {
        val session = newSession()
        val history = mutableListOf(ChatMessage(role = "system", content = "Be brief."), ChatMessage(role = "user", content = "Hi!"))
        val first = session.chat(history, greedy(8u), Collect())
        expect(first.generatedTokens > 0u && first.promptTokens > 5u) { "$first" }
        history += ChatMessage(role = "assistant", content = first.text)
        history += ChatMessage(role = "user", content = "More?")
        val second = session.chat(history, greedy(8u), Collect())
        expect(second.promptTokens > first.promptTokens) { "$second" }
        session.reset()
        expect(session.chat(history, greedy(8u), Collect()).text == second.text) { "reset changed the answer" }
    }

    test("loadFromFd, the descriptor closed afterwards") {
        val fd = libc.open(moePath, 0)
        expect(fd >= 0) { "open failed" }
        val model = try {
            PocketModel.loadFromFd(fd, 0uL, File(moePath).length().toULong(), LoadOptions())
        } finally {
            libc.close(fd)
        }
        expect(model.info() == moe.info()) { "${model.info()}" }
        expect(PocketSession(model, SessionOptions()).generate("Hi", greedy(4u), Collect()).generatedTokens == 4u) { "no tokens" }
    }

    test("loadFromFd at an offset, like an APK asset, read into memory with progress") {
        val bytes = File(moePath).readBytes()
        val prefix = ByteArray(4113) { 7 }
        val apk = File.createTempFile("app", ".apk").apply { writeBytes(prefix + bytes + "tail".toByteArray()); deleteOnExit() }
        val seen = mutableListOf<Float>()
        val progress = object : LoadProgressListener {
            override fun onProgress(fraction: Float) { seen += fraction }
        }
        val fd = libc.open(apk.path, 0)
        val model = try {
            PocketModel.loadFromFd(fd, prefix.size.toULong(), bytes.size.toULong(), LoadOptions(useMmap = false, progress = progress))
        } finally {
            libc.close(fd)
        }
        expect(model.info() == moe.info()) { "${model.info()}" }
        expect(seen.first() == 0f && seen.last() == 1f && seen == seen.sorted()) { "progress $seen" }
        val fd2 = libc.open(apk.path, 0)
        try {
            expectThrows<PocketException.InvalidArgument> { PocketModel.loadFromFd(fd2, 16uL, apk.length().toULong(), LoadOptions()) }
        } finally {
            libc.close(fd2)
        }
    }

    test("concurrent requests on one session take turns") {
        val session = newSession()
        val expected = session.generate("Hello", greedy(8u), Collect()).text
        val results = java.util.Collections.synchronizedList(mutableListOf<Any>())
        (1..3).map { thread { results += runCatching { session.generate("Hello", greedy(8u), Collect()).text }.getOrElse { it } } }
            .forEach { it.join(60_000) }
        expect(results == listOf(expected, expected, expected)) { "$results" }
    }

    // ---- the Flow layer ----------------------------------------------------------------------

    test("generateFlow streams the same text as generate, with stats") {
        val expected = newSession().generate("Hello", greedy(10u), Collect()).text
        var stats: GenerationStats? = null
        val pieces = runBlocking { newSession().generateFlow("Hello", greedy(10u)) { stats = it }.toList() }
        expect(pieces.joinToString("") == expected && stats?.text == expected) { "$pieces vs '$expected'" }
    }

    test("take(n) on the flow stops the engine, and the session goes on") {
        val session = newSession()
        val pieces = runBlocking { withTimeout(30_000) { session.generateFlow("Hello", GenerateOptions(maxTokens = 3000u)).take(3).toList() } }
        expect(pieces.size == 3) { "$pieces" }
        expect(session.generate("Hello", greedy(4u), Collect()).generatedTokens == 4u) { "session unusable" }
    }

    test("cancelling the collecting coroutine cancels the generation") {
        val session = newSession()
        var stats: GenerationStats? = null
        runBlocking {
            val first = CompletableDeferred<Unit>()
            val job = launch {
                session.generateFlow("Hello", GenerateOptions(maxTokens = 3000u, temperature = 1f)) { stats = it }
                    .collect { first.complete(Unit); delay(1) }
            }
            first.await()
            withTimeout(30_000) { job.cancelAndJoin() }
        }
        val s = stats
        expect(s != null && s.stopReason == StopReason.CANCELLED && s.generatedTokens < 3000u) { "not cancelled: $s" }
    }

    test("chatFlow and errors through the flow") {
        val text = runBlocking { newSession().chatFlow(listOf(ChatMessage(role = "user", content = "Hi")), greedy(6u)).toList() }
        expect(text.isNotEmpty()) { "no pieces" }
        expectThrows<PocketException.InvalidArgument> {
            runBlocking { newSession().chatFlow(emptyList(), greedy(6u)).toList() }
        }
    }

    // ---- the Android helpers' logic (PocketDescriptors.kt) -------------------------------------

    test("loadFromDescriptor loads a range of an open descriptor, as loadAsset does") {
        val bytes = File(moePath).readBytes()
        val prefix = ByteArray(100) { 1 }
        val apk = File.createTempFile("assets", ".apk").apply { writeBytes(prefix + bytes); deleteOnExit() }
        val fd = libc.open(apk.path, 0)
        val model = try {
            loadFromDescriptor(fd, prefix.size.toLong(), bytes.size.toLong(), "asset tiny.gguf", LoadOptions())
        } finally {
            libc.close(fd)
        }
        expect(model.info() == moe.info()) { "${model.info()}" }
    }

    test("an unknown size (statSize -1, a pipe) is Io with the remedy, before the engine sees it") {
        val fd = libc.open(moePath, 0)
        try {
            val e = expectThrows<PocketException.Io> { loadFromDescriptor(fd, 0L, -1L, "content://x/model", LoadOptions()) }
            expect(e.reason.startsWith("content://x/model") && e.reason.contains("filesDir")) { e.reason }
            val empty = expectThrows<PocketException.Io> { loadFromDescriptor(fd, 0L, 0L, "content://x/model", LoadOptions()) }
            expect(empty.reason.contains("empty")) { empty.reason }
            expectThrows<PocketException.InvalidArgument> { loadFromDescriptor(fd, -5L, 10L, "asset a", LoadOptions()) }
        } finally {
            libc.close(fd)
        }
        val none = expectThrows<PocketException.Io> { loadFromDescriptor(-1, 0L, 10L, "content://y", LoadOptions()) }
        expect(none.reason.contains("no file descriptor")) { none.reason }
    }

    test("open failures become Io with a hint; engine errors and other failures pass through") {
        // AssetManager.openFd on a compressed asset throws FileNotFoundException.
        val compressed = expectThrows<PocketException.Io> {
            loadingFrom("asset big.gguf", ASSET_HINT) { throw FileNotFoundException("This file can not be opened as a file descriptor; it is probably compressed") }
        }
        expect(compressed.reason.startsWith("asset big.gguf: This file") && compressed.reason.contains("noCompress")) { compressed.reason }
        val revoked = expectThrows<PocketException.Io> {
            loadingFrom("content://docs/1", URI_HINT) { throw SecurityException("Permission Denial: opening provider") }
        }
        expect(revoked.reason.contains("permission denied") && revoked.reason.contains("Pick the file again")) { revoked.reason }
        val junk = File.createTempFile("junk", ".gguf").apply { writeText("not a model".repeat(20)); deleteOnExit() }
        expectThrows<PocketException.InvalidModel> { loadingFrom(junk.path, URI_HINT) { PocketModel.load(junk.path, LoadOptions()) } }
        expectThrows<IllegalStateException> { loadingFrom("asset a", ASSET_HINT) { throw IllegalStateException("a bug") } }
        expect(loadingFrom("asset a", ASSET_HINT) { 42 } == 42) { "value not returned" }
    }

    test("save and restore: the restored session continues identically; damaged snapshots are typed errors") {
        val dir = java.nio.file.Files.createTempDirectory("pocket-snap").toFile()
        try {
            val options = SessionOptions(contextLength = 256u)
            val s = newSession(options)
            val first = Collect()
            s.generate("Once upon a time", greedy(8u), first)
            val path = File(dir, "s.snap").path
            s.save(path)
            val next = "Once upon a time${first.text} and"
            val uninterrupted = s.generate(next, greedy(8u), Collect())
            val restored = PocketSession.restore(moe, path, options).generate(next, greedy(8u), Collect())
            expect(restored.text == uninterrupted.text) { "${restored.text} != ${uninterrupted.text}" }
            val ctx = expectThrows<PocketException.InvalidArgument> { PocketSession.restore(moe, path, SessionOptions(contextLength = 128u)) }
            expect(ctx.reason.contains("context")) { ctx.reason }
            val bytes = File(path).readBytes()
            bytes[bytes.size / 2] = (bytes[bytes.size / 2].toInt() xor 0x10).toByte()
            val damaged = File(dir, "damaged.snap").apply { writeBytes(bytes) }.path
            val flip = expectThrows<PocketException.InvalidArgument> { PocketSession.restore(moe, damaged, options) }
            expect(flip.reason.contains("checksum")) { flip.reason }
            expectThrows<PocketException.Io> { PocketSession.restore(moe, File(dir, "none.snap").path, options) }
        } finally {
            dir.deleteRecursively()
        }
    }

    structuredTests(moePath)
    downloadTests()

    var failed = 0
    for ((name, body) in tests) {
        try {
            body()
            println("PASS $name")
        } catch (e: Throwable) {
            failed++
            println("FAIL $name: $e")
            e.printStackTrace()
        }
    }
    println("${tests.size - failed} passed, $failed failed")
    exitProcess(if (failed == 0) 0 else 1)
}
