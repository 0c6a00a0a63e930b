package dev.pocket.chat

import java.io.File
import uniffi.pocket.DownloadRequest
import uniffi.pocket.PocketException

/**
 * A model the app offers to download: shown as "Download NAME (SIZE)" in the
 * empty chat and the Model menu, fetched with Pocket's `downloadModelFlow`
 * (resumable, verified by SHA-256) into `filesDir/models`.
 */
data class CatalogModel(
    /** Shown on the buttons and in the status line. */
    val name: String,
    /**
     * `https://…` or `hf://OWNER/REPO/FILE[@REVISION]`. Several URLs are the
     * shards of one model, downloaded as one with one progress.
     */
    val urls: List<String>,
    /** The published SHA-256 of each URL's file (64 hex digits), in the same order. */
    val sha256: List<String>,
    /** About how much it downloads, for the button label only: the progress bar uses the server's size. */
    val approximateBytes: Long,
    /**
     * The file in `filesDir/models`, found again by this name at the next
     * launch. For shards: the first shard's name (they are saved under their
     * URLs' names and loaded from the first).
     */
    val fileName: String,
) {
    /** "Gemma 3 270M (253 MB)". */
    val label: String get() = "$name (${megabytes(approximateBytes)})"

    /**
     * One URL: the file itself; shards: the folder that receives them. The
     * same request later resumes the partial file (`FILE.part`).
     */
    fun request(modelsDir: File): DownloadRequest =
        if (urls.size == 1) {
            DownloadRequest(urls.single(), sha256.single(), File(modelsDir, fileName))
        } else {
            DownloadRequest(urls, sha256, folder = modelsDir)
        }
}

/** What the app can download. One entry today; more are shown the same way. */
val modelCatalog = listOf(
    CatalogModel(
        name = "Gemma 3 270M",
        urls = listOf("hf://bartowski/google_gemma-3-270m-it-GGUF/google_gemma-3-270m-it-Q4_K_M.gguf"),
        // The file's published SHA-256: a wrong one ends as PocketException.Integrity, never a loaded file.
        sha256 = listOf("c866c9f113f2e9aa2225c5997ede437392b8fa844ba5db9e4c77e315ffe20800"),
        approximateBytes = 253_000_000,
        fileName = "google_gemma-3-270m-it-Q4_K_M.gguf",
    ),
)

/** "253 MB", "1.2 GB" (decimal units, as storage is sold). */
fun megabytes(bytes: Long): String =
    if (bytes >= 1_000_000_000) "%.1f GB".format(bytes / 1e9) else "${bytes / 1_000_000} MB"

/**
 * A failed download, told by what the user can do about it. The partial file
 * stays for every kind but `Integrity` (whose file was deleted).
 */
fun describeDownloadFailure(e: Throwable, model: CatalogModel): String = when (e) {
    is PocketException.Network ->
        "Network error (${e.reason}). What arrived is kept: Download resumes where it stopped."
    is PocketException.Integrity ->
        "${model.name} is not the expected file (${e.reason}); the file was deleted. Try again."
    is PocketException.Storage ->
        "Not enough space for ${model.name} (${e.reason}). Free some space; Download then resumes."
    is PocketException.InvalidArgument -> "The catalog entry for ${model.name} is wrong: ${e.reason}"
    else -> "Downloading ${model.name} failed: ${e.message ?: e.javaClass.simpleName}"
}
