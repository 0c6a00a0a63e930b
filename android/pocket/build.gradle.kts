// The Pocket AAR: generated UniFFI bindings (src/main/kotlin/uniffi/pocket/pocket.kt),
// the Flow and Android layers, JNA, and libpocket_ffi.so for arm64-v8a,
// armeabi-v7a and x86_64 built by cargo-ndk from the Rust workspace.
// Published with its POM (dev.pocket:pocket, JNA and coroutines as dependencies)
// to the local repository android/build/maven by `cargo xtask aar`.

plugins {
    id("com.android.library")
    id("org.jetbrains.kotlin.android")
    `maven-publish`
}

/** The Rust workspace: this module lives in <repo>/android/pocket. */
val repoRoot: File = projectDir.parentFile.parentFile
/** One version for the crates and the AAR: the workspace's, from the root Cargo.toml. */
val pocketVersion: String = Regex("""(?m)^version\s*=\s*"([^"]+)"""")
    .find(repoRoot.resolve("Cargo.toml").readText())?.groupValues?.get(1)
    ?: error("no version in ${repoRoot.resolve("Cargo.toml")}")
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
    // 5.18.1 or later: older Android builds of libjnidispatch.so are not 16 KB aligned (fixed in
    // 5.16/5.17; 5.16 brought a Structure deadlock, fixed in 5.18). The test suite checks the pin,
    // and `cargo xtask aar` checks the library's alignment.
    api("net.java.dev.jna:jna:5.18.1@aar")
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
    // `--features gpu`: the Vulkan backend (LoadOptions.backend = Backend.GPU).
    args += listOf("--platform", "24", "-o", out.path, "build", "-p", "pocket-ffi", "--lib", "--features", "gpu", "--profile", cargoProfile)
    commandLine(args)
    doFirst {
        // cargo-ndk finds the NDK through ANDROID_NDK_HOME; default to the one this module pins.
        if (System.getenv("ANDROID_NDK_HOME") == null) {
            environment("ANDROID_NDK_HOME", android.ndkDirectory.absolutePath)
        }
    }
    // Everything cargo reads for this build: sources, manifests, the lock file (dependency
    // versions, profiles) and the build script that passes the 16 KB page link flag.
    inputs.dir(repoRoot.resolve("core/src"))
    inputs.dir(repoRoot.resolve("bindings/src"))
    inputs.files(
        repoRoot.resolve("Cargo.toml"),
        repoRoot.resolve("Cargo.lock"),
        repoRoot.resolve("core/Cargo.toml"),
        repoRoot.resolve("bindings/Cargo.toml"),
        repoRoot.resolve("bindings/build.rs"),
    )
    inputs.property("profile", cargoProfile)
    outputs.dir(out)
}

tasks.named("preBuild") { dependsOn(cargoNdk) }

// ---- publication ----------------------------------------------------------------------------

publishing {
    publications {
        register<MavenPublication>("release") {
            groupId = "dev.pocket"
            artifactId = "pocket"
            version = pocketVersion
            pom {
                name.set("Pocket")
                description.set("On-device LLM inference for Android: the Rust engine, its Kotlin bindings and a Flow API.")
                licenses {
                    license { name.set("MIT OR Apache-2.0") }
                }
            }
            // The component (AAR + the api dependencies, JNA and coroutines, in the POM) exists
            // once the Android plugin has configured the release variant.
            afterEvaluate { from(components["release"]) }
        }
    }
    repositories {
        // `cargo xtask aar` publishes here; apps add it with maven { url = uri(".../android/build/maven") }.
        maven {
            name = "local"
            url = uri(rootProject.layout.buildDirectory.dir("maven"))
        }
    }
}
