// swift-tools-version:5.9
// Pocket for iOS (and macOS, for tests): the generated UniFFI bindings plus a
// Swift concurrency layer (ios/Sources/Pocket) over the Rust engine, shipped
// as a static-library XCFramework (ios/PocketFFI.xcframework).
//
// Build the XCFramework first, on a Mac with Xcode and rustup:
//     cargo xtask xcframework
// then `swift build` / `swift test` here, or add this repository as a package
// dependency in Xcode. To consume a released build instead, replace the binary
// target's `path:` with `url:` + `checksum:` (`swift package compute-checksum`).

import PackageDescription

let package = Package(
    name: "Pocket",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "Pocket", targets: ["Pocket"]),
    ],
    targets: [
        .binaryTarget(name: "PocketFFI", path: "ios/PocketFFI.xcframework"),
        .target(
            name: "Pocket",
            dependencies: ["PocketFFI"],
            path: "ios/Sources/Pocket"
        ),
        .testTarget(
            name: "PocketTests",
            dependencies: ["Pocket"],
            path: "ios/Tests/PocketTests"
        ),
    ]
)
