// The Android-free half of loading models from APK assets and content URIs:
// checking the descriptor range an AssetFileDescriptor or ParcelFileDescriptor
// handed over, and turning Java I/O failures into PocketException.Io whose
// reason says what to do. PocketAndroid.kt is the thin Android shell around
// it; this file uses no Android API, so the JVM harness (bindings/tests/kotlin)
// compiles and tests it.

package uniffi.pocket

import java.io.IOException

/** What to do when an APK asset cannot be opened as a descriptor: it was compressed (or is missing). */
internal const val ASSET_HINT =
    "An asset is mapped in place, so it must be stored uncompressed: add " +
        "androidResources { noCompress += \"gguf\" } to the app's build.gradle.kts, and check the name"

/** What to do when a picked document cannot be opened: the grant is gone, or the provider refuses. */
internal const val URI_HINT =
    "Pick the file again (access to a picked document lasts as long as its grant; keep it with " +
        "contentResolver.takePersistableUriPermission), or copy it into context.filesDir and use loadFile"

/**
 * Loads bytes [offset] to [offset] + [length] of the open descriptor [fd]
 * (the descriptor can be closed once this returns: the engine keeps its own).
 * [source] names the model in error messages.
 *
 * A [length] of -1 is what `ParcelFileDescriptor.statSize` and
 * `AssetFileDescriptor.length` report when the provider serves a stream (a
 * pipe) rather than a file: that cannot be mapped, and passed on it would read
 * as 2^64 - 1 bytes and fail with a confusing range error, so it is refused
 * here with the remedy.
 */
internal fun loadFromDescriptor(fd: Int, offset: Long, length: Long, source: String, options: LoadOptions): PocketModel {
    if (fd < 0) {
        throw PocketException.Io("$source: the provider returned no file descriptor")
    }
    if (length < 0) {
        throw PocketException.Io(
            "$source has no known size: its provider serves it as a stream, which cannot be memory-mapped. " +
                "Copy it into context.filesDir and load the copy with PocketModel.loadFile",
        )
    }
    if (offset < 0) {
        throw PocketException.InvalidArgument("$source: negative offset $offset")
    }
    if (length == 0L) {
        throw PocketException.Io("$source is empty")
    }
    return PocketModel.loadFromFd(fd, offset.toULong(), length.toULong(), options)
}

/**
 * Runs [load], which opens [source] and loads it, turning the Java failures of
 * opening (a missing or compressed asset, an unreadable file, a revoked
 * permission) into [PocketException.Io] whose reason ends with [hint]. Engine
 * errors ([PocketException]) and anything else pass through unchanged.
 */
internal inline fun <T> loadingFrom(source: String, hint: String, load: () -> T): T =
    try {
        load()
    } catch (e: IOException) {
        throw PocketException.Io("$source: ${e.message ?: e.javaClass.simpleName}. $hint")
    } catch (e: SecurityException) {
        throw PocketException.Io("$source: permission denied (${e.message ?: "no detail"}). $hint")
    }
