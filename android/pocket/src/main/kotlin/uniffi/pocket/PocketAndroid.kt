// Android helpers: loading models from APK assets and content URIs through
// PocketModel.loadFromFd, and loading the native library through
// System.loadLibrary so that its JNI_OnLoad routes engine logs to logcat
// (UniFFI itself loads it through JNA, which skips JNI_OnLoad).

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
 * `androidResources { noCompress += "gguf" }`.
 */
fun PocketModel.Companion.loadAsset(
    context: Context,
    assetName: String,
    options: LoadOptions = LoadOptions(),
): PocketModel {
    Pocket.init()
    context.assets.openFd(assetName).use { afd ->
        return loadFromFd(afd.parcelFileDescriptor.fd, afd.startOffset.toULong(), afd.length.toULong(), options)
    }
}

/** Load a model the user picked (Storage Access Framework `content://` URI or a file URI). */
fun PocketModel.Companion.loadUri(
    context: Context,
    uri: Uri,
    options: LoadOptions = LoadOptions(),
): PocketModel {
    Pocket.init()
    val pfd = context.contentResolver.openFileDescriptor(uri, "r")
        ?: throw PocketException.Io("cannot open $uri")
    pfd.use {
        return loadFromFd(it.fd, 0uL, it.statSize.toULong(), options)
    }
}

/** Load a model file by path (app-private storage, e.g. `context.filesDir`). */
fun PocketModel.Companion.loadFile(path: String, options: LoadOptions = LoadOptions()): PocketModel {
    Pocket.init()
    return load(path, options)
}
