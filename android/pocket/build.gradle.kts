// The Pocket AAR: generated UniFFI bindings (src/main/kotlin/uniffi/pocket/pocket.kt),
// the Flow and Android layers, JNA, and libpocket_ffi.so for arm64-v8a,
// armeabi-v7a and x86_64 built by cargo-ndk from the Rust workspace.

plugins {
    id("com.android.library")
    id("org.jetbrains.kotlin.android")
}

/** The Rust workspace: this module lives in <repo>/android/pocket. */
val repoRoot: File = projectDir.parentFile.parentFile
val cargoProfile: String = providers.gradleProperty("pocket.cargoProfile").getOrElse("mobile")
val skipCargo: Boolean = providers.gradleProperty("pocket.skipCargo").map { it.toBoolean() }.getOrElse(false)
val abis = listOf("arm64-v8a", "armeabi-v7a", "x86_64")

android {
    namespace = "dev.pocket"
    compileSdk = 35
    // r27 needs the 16 KB page flag, which bindings/build.rs passes to the linker.
    ndkVersion = "27.2.12479018"

    defaultConfig {
        minSdk = 24
        consumerProguardFiles("consumer-rules.pro")
        ndk { abiFilters += abis }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    publishing {
        singleVariant("release")
    }
}

kotlin {
    compilerOptions {
        jvmTarget.set(org.jetbrains.kotlin.gradle.dsl.JvmTarget.JVM_17)
    }
}

dependencies {
    // UniFFI's Kotlin bindings call the library through JNA (the AAR flavour carries libjnidispatch.so).
    api("net.java.dev.jna:jna:5.15.0@aar")
    api("org.jetbrains.kotlinx:kotlinx-coroutines-android:1.9.0")
}

// ---- the native library -------------------------------------------------------------------

val cargoNdk by tasks.registering(Exec::class) {
    description = "Builds libpocket_ffi.so for ${abis.joinToString()} with cargo-ndk (profile $cargoProfile)."
    group = "build"
    onlyIf { !skipCargo }
    workingDir = repoRoot
    val out = layout.projectDirectory.dir("src/main/jniLibs").asFile
    val args = mutableListOf("cargo", "ndk")
    abis.forEach { args += listOf("-t", it) }
    args += listOf("--platform", "24", "-o", out.path, "build", "-p", "pocket-ffi", "--lib", "--profile", cargoProfile)
    commandLine(args)
    doFirst {
        // cargo-ndk finds the NDK through ANDROID_NDK_HOME; default to the one this module pins.
        if (System.getenv("ANDROID_NDK_HOME") == null) {
            environment("ANDROID_NDK_HOME", android.ndkDirectory.absolutePath)
        }
    }
    inputs.dir(repoRoot.resolve("core/src"))
    inputs.dir(repoRoot.resolve("bindings/src"))
    inputs.property("profile", cargoProfile)
    outputs.dir(out)
}

tasks.named("preBuild") { dependsOn(cargoNdk) }
