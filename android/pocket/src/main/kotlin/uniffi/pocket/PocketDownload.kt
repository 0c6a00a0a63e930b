// Kotlin coroutines layer over `downloadModel` (pocket.kt): a model download
// as a cold Flow of progress that ends with the file's path, and cancels the
// download when its collector goes away. Pure Kotlin (no Android APIs), so it
// is tested on the JVM too (bindings/tests/kotlin).

package uniffi.pocket

import java.io.File
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.channels.awaitClose
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.buffer
import kotlinx.coroutines.flow.callbackFlow

/** Where a model download stands. */
sealed class DownloadUpdate {
    /** Bytes on disk of all parts, and their total (0 until the server says). */
    data class Progress(val doneBytes: ULong, val totalBytes: ULong) : DownloadUpdate() {
        /** 0.0 to 1.0 (0.0 while the total is unknown). */
        val fraction: Double get() = if (totalBytes == 0uL) 0.0 else doneBytes.toDouble() / totalBytes.toDouble()
    }

    /** Every part verified and in place: the file to load (of several parts, the first). */
    data class Finished(val path: String) : DownloadUpdate()
}

/** One file with its expected SHA-256 (64 hex digits), saved at [destination]. */
fun DownloadRequest(url: String, sha256: String, destination: File): DownloadRequest =
    DownloadRequest(urls = listOf(url), sha256 = listOf(sha256), destination = destination.path)

/**
 * The shards of one model (one URL and one SHA-256 each), saved under their
 * URLs' file names in [folder]; load the first.
 */
fun DownloadRequest(urls: List<String>, sha256: List<String>, folder: File): DownloadRequest =
    DownloadRequest(urls = urls, sha256 = sha256, destination = folder.path + File.separator)

/**
 * Downloads [request] (resumable, verified) as a cold flow of
 * [DownloadUpdate.Progress] ending with [DownloadUpdate.Finished]. Each
 * collection starts (or resumes) the download on its own thread; cancelling
 * the collector (or its scope) cancels it, keeping the partial file for the
 * next collection. Failures arrive as [PocketException] (`Network`,
 * `Integrity`, `Storage`, `InvalidArgument`).
 *
 *     downloadModelFlow(DownloadRequest(listOf(url), listOf(sha256), file.path)).collect { u ->
 *         when (u) {
 *             is DownloadUpdate.Progress -> progress.value = u.fraction
 *             is DownloadUpdate.Finished -> model = PocketModel.load(u.path, LoadOptions())
 *         }
 *     }
 */
fun downloadModelFlow(request: DownloadRequest): Flow<DownloadUpdate> = callbackFlow {
    val handle = downloadModel(request, object : DownloadListener {
        override fun onProgress(doneBytes: ULong, totalBytes: ULong) {
            trySend(DownloadUpdate.Progress(doneBytes, totalBytes))
        }

        override fun onFinished(path: String) {
            trySend(DownloadUpdate.Finished(path))
            channel.close()
        }

        override fun onFailed(error: PocketException) {
            channel.close(error)
        }
    })
    // After the end this is a no-op; before it, the download stops and keeps its partial file.
    awaitClose { handle.cancel() }
}.buffer(Channel.UNLIMITED)
