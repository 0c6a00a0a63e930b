// Android helpers: loading models from APK assets and content URIs through
// PocketModel.loadFromFd, and loading the native library through
// System.loadLibrary so that its JNI_OnLoad routes engine logs to logcat
// (UniFFI itself loads it through JNA, which skips JNI_OnLoad).
// Only the Android calls live here; the checks and the error mapping are in
// PocketDescriptors.kt, which the JVM test harness covers.

package uniffi.pocket

import android.content.Context
import android.net.Uri

/** Process-wide setup of the native library. */
object Pocket {
    private val loaded: Unit by lazy { System.loadLibrary("pocket_ffi") }

    /** Load libpocket_ffi.so via the JVM (logcat logging). Idempotent; the helpers below call it. */
    fun init() = loaded
}

/**
 * Load a model stored *uncompressed* in the APK's assets, memory-mapped in
 * place. Keep .gguf files uncompressed in the app's build.gradle.kts:
 * `androidResources { noCompress += "gguf" }`. A compressed or missing asset
 * raises [PocketException.Io] saying so.
 */
fun PocketModel.Companion.loadAsset(
    context: Context,
    assetName: String,
    options: LoadOptions = LoadOptions(),
): PocketModel {
    Pocket.init()
    val source = "asset $assetName"
    return loadingFrom(source, ASSET_HINT) {
        context.assets.openFd(assetName).use { afd ->
            loadFromDescriptor(afd.parcelFileDescriptor.fd, afd.startOffset, afd.length, source, options)
        }
    }
}

/**
 * Load a model the user picked (Storage Access Framework `content://` URI or a
 * file URI). A revoked grant, an unreadable file or a provider that serves a
 * stream rather than a file raises [PocketException.Io] with what to do.
 */
fun PocketModel.Companion.loadUri(
    context: Context,
    uri: Uri,
    options: LoadOptions = LoadOptions(),
): PocketModel {
    Pocket.init()
    val source = uri.toString()
    return loadingFrom(source, URI_HINT) {
        val pfd = context.contentResolver.openFileDescriptor(uri, "r")
            ?: throw PocketException.Io("$source: the content provider returned nothing")
        pfd.use { loadFromDescriptor(it.fd, 0L, it.statSize, source, options) }
    }
}

/** Load a model file by path (app-private storage, e.g. `context.filesDir`). */
fun PocketModel.Companion.loadFile(path: String, options: LoadOptions = LoadOptions()): PocketModel {
    Pocket.init()
    return load(path, options)
}
