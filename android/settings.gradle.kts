// The Pocket Android library (AAR). Open this folder in Android Studio, or
// run `gradle :pocket:assembleRelease` (see README.md).

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

rootProject.name = "pocket-android"
include(":pocket")
