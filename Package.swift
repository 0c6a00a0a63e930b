// swift-tools-version:5.9
// Pocket for iOS (and macOS, for tests): the generated UniFFI bindings plus a
// Swift concurrency layer (ios/Sources/Pocket) over the Rust engine, shipped
// as a static-library XCFramework (the binary target PocketFFI).
//
// Apps add this repository as a package dependency at a release tag; the
// binary target is then the release's zipped XCFramework, downloaded and
// verified against its checksum. Working on the package itself (or on the
// sample app), build the XCFramework locally and select it:
//     cargo xtask xcframework                  # -> ios/PocketFFI.xcframework
//     POCKET_LOCAL_XCFRAMEWORK=1 swift test
// See ios/README.md.

import PackageDescription

/// The XCFramework of the release this revision belongs to: the zip that
/// `cargo xtask xcframework --zip` makes, uploaded to the GitHub release, and
/// its SwiftPM checksum (the command prints this declaration, filled in, to
/// set in the commit that is tagged). nil until the first release.
let releasedXCFramework: (url: String, checksum: String)? = nil

/// POCKET_LOCAL_XCFRAMEWORK=1 (or a revision without a release) links
/// ios/PocketFFI.xcframework, built by `cargo xtask xcframework`, instead.
let pocketFFI: Target = {
    if let release = releasedXCFramework, Context.environment["POCKET_LOCAL_XCFRAMEWORK"] != "1" {
        return .binaryTarget(name: "PocketFFI", url: release.url, checksum: release.checksum)
    }
    return .binaryTarget(name: "PocketFFI", path: "ios/PocketFFI.xcframework")
}()

let package = Package(
    name: "Pocket",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "Pocket", targets: ["Pocket"]),
    ],
    targets: [
        pocketFFI,
        .target(
            name: "Pocket",
            dependencies: ["PocketFFI"],
            path: "ios/Sources/Pocket",
            // The static library's GPU backend (wgpu on Metal); a static
            // library does not bring its frameworks along (rustc's
            // --print native-static-libs lists them).
            linkerSettings: [
                .linkedFramework("Metal"),
                .linkedFramework("QuartzCore"),
                .linkedFramework("CoreGraphics"),
                .linkedFramework("Foundation"),
            ]
        ),
        .testTarget(
            name: "PocketTests",
            dependencies: ["Pocket"],
            path: "ios/Tests/PocketTests"
        ),
    ]
)
