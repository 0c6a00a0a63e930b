// downloadModel and downloadModelFlow (PocketDownload.kt) against a local
// HTTP server (the JDK's com.sun.net.httpserver): progress then the path, a
// wrong hash as PocketException.Integrity, a 404 as Network.

import com.sun.net.httpserver.HttpServer
import java.io.File
import java.net.InetSocketAddress
import java.security.MessageDigest
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import uniffi.pocket.*

internal fun downloadTests() {
    val data = ByteArray(1_500_000) { (it * 31 + it / 7).toByte() }
    val sha = MessageDigest.getInstance("SHA-256").digest(data).joinToString("") { "%02x".format(it) }
    val server = HttpServer.create(InetSocketAddress("127.0.0.1", 0), 0)
    server.createContext("/m.gguf") { ex ->
        ex.responseHeaders.add("ETag", "\"v1\"")
        if (ex.requestMethod == "HEAD") {
            ex.responseHeaders.add("Content-Length", data.size.toString())
            ex.sendResponseHeaders(200, -1)
        } else {
            ex.sendResponseHeaders(200, data.size.toLong())
            ex.responseBody.use { it.write(data) }
        }
        ex.close()
    }
    server.createContext("/missing") { ex ->
        ex.sendResponseHeaders(404, -1)
        ex.close()
    }
    server.start()
    val base = "http://127.0.0.1:${server.address.port}"
    val dir = File(System.getProperty("java.io.tmpdir"), "pocket-kotlin-download-${ProcessHandle.current().pid()}")
    dir.deleteRecursively()
    dir.mkdirs()

    test("downloadModelFlow: progress, then the verified file's path") {
        val dest = File(dir, "m.gguf")
        val updates = runBlocking { downloadModelFlow(DownloadRequest("$base/m.gguf", sha, dest)).toList() }
        val last = updates.last()
        expect(last == DownloadUpdate.Finished(dest.path)) { "$updates" }
        val progress = updates.filterIsInstance<DownloadUpdate.Progress>()
        expect(progress.isNotEmpty() && progress.last().doneBytes == data.size.toULong()) { "$progress" }
        expect(dest.readBytes().contentEquals(data)) { "content" }
    }

    test("a wrong hash is PocketException.Integrity, a 404 Network, a bad hash InvalidArgument") {
        val wrong = "0".repeat(64)
        expectThrows<PocketException.Integrity> {
            runBlocking { downloadModelFlow(DownloadRequest(listOf("$base/m.gguf"), listOf(wrong), File(dir, "w").path)).toList() }
        }
        expect(!File(dir, "w").exists()) { "an unverified file was kept" }
        val e = expectThrows<PocketException.Network> {
            runBlocking { downloadModelFlow(DownloadRequest(listOf("$base/missing"), listOf(wrong), File(dir, "n").path)).toList() }
        }
        expect(e.reason.contains("404")) { e.reason }
        expectThrows<PocketException.InvalidArgument> {
            runBlocking { downloadModelFlow(DownloadRequest(listOf("$base/m.gguf"), listOf("abc"), File(dir, "x").path)).toList() }
        }
    }

    test("resolveDownloadUrl: hf:// as the hub's resolve URL, other URLs unchanged, a malformed one InvalidArgument") {
        val hub = resolveDownloadUrl("hf://org/repo/model-Q4_K_M.gguf@v1.0")
        expect(hub.endsWith("/org/repo/resolve/v1.0/model-Q4_K_M.gguf")) { hub }
        expect(resolveDownloadUrl("$base/m.gguf") == "$base/m.gguf") { "plain URL changed" }
        expectThrows<PocketException.InvalidArgument> { resolveDownloadUrl("hf://only-owner") }
    }
}
