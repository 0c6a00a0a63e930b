// Pocket Chat for Android: a Jetpack Compose sample on the Pocket AAR module,
// which is built from source (android/pocket, Rust via cargo-ndk).

pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}

dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()
        mavenCentral()
    }
}

rootProject.name = "pocket-chat"
include(":app")
include(":pocket")
project(":pocket").projectDir = file("../../android/pocket")
