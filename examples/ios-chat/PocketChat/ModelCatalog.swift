import Foundation
import Pocket

/// A model the app offers to download: shown as "Download NAME (SIZE)" in
/// the empty chat and the Model menu, fetched with Pocket's `downloadModel`
/// (resumable, verified by SHA-256) into Application Support/Models.
struct CatalogModel: Identifiable, Hashable, Sendable {
    /// Shown on the buttons and in the status line.
    let name: String
    /// `https://…` or `hf://OWNER/REPO/FILE[@REVISION]`. Several URLs are the
    /// shards of one model, downloaded as one with one progress.
    let urls: [String]
    /// The published SHA-256 of each URL's file (64 hex digits), in the same order.
    let sha256: [String]
    /// About how much it downloads, for the button label only: the progress
    /// bar uses the size the server gives.
    let approximateBytes: Int64
    /// The file in Application Support/Models, found again by this name at
    /// the next launch. For shards: the first shard's name (they are saved
    /// under their URLs' names and loaded from the first).
    let fileName: String

    var id: String { fileName }

    /// "Gemma 3 270M (253 MB)".
    var label: String { "\(name) (\(megabytes(approximateBytes)))" }

    /// The loadable file, once downloaded and verified.
    var file: URL { modelsFolder.appendingPathComponent(fileName) }

    var isDownloaded: Bool { FileManager.default.fileExists(atPath: file.path) }

    /// One URL: the file itself; shards: the folder that receives them. The
    /// same request later resumes the partial file (`FILE.part`).
    var request: DownloadRequest {
        if urls.count == 1 {
            return DownloadRequest(url: urls[0], sha256: sha256[0], destination: file)
        }
        return DownloadRequest(urls: urls, sha256: sha256, folder: modelsFolder)
    }
}

/// What the app can download. One entry today; more are shown the same way.
let modelCatalog: [CatalogModel] = [
    CatalogModel(
        name: "Gemma 3 270M",
        urls: ["hf://bartowski/google_gemma-3-270m-it-GGUF/google_gemma-3-270m-it-Q4_K_M.gguf"],
        // The file's published SHA-256: a wrong one ends as PocketError.Integrity, never a loaded file.
        sha256: ["c866c9f113f2e9aa2225c5997ede437392b8fa844ba5db9e4c77e315ffe20800"],
        approximateBytes: 253_000_000,
        fileName: "google_gemma-3-270m-it-Q4_K_M.gguf"),
]

/// Application Support/Models: downloaded models. Not Documents (the user's
/// files, shown in the Files app) and not Caches (iOS may empty it): the app
/// owns these files and they survive, but they are excluded from iCloud
/// backup, since they can be downloaded again.
let modelsFolder: URL = {
    let base = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
        ?? FileManager.default.temporaryDirectory
    return base.appendingPathComponent("Models", isDirectory: true)
}()

/// Creates the Models folder if needed and marks it excluded from backup
/// (which covers the files in it, the partial ones included). Called before
/// each download: the SDK would create the folder, but not mark it.
func prepareModelsFolder() throws {
    try FileManager.default.createDirectory(at: modelsFolder, withIntermediateDirectories: true)
    var values = URLResourceValues()
    values.isExcludedFromBackup = true
    var folder = modelsFolder
    try folder.setResourceValues(values)
}

/// "253 MB", "1.2 GB" (decimal units, as storage is sold).
func megabytes<T: BinaryInteger>(_ bytes: T) -> String {
    let value = Double(bytes)
    return value >= 1e9 ? String(format: "%.1f GB", value / 1e9) : "\(Int(value / 1e6)) MB"
}

/// A failed download, told by what the user can do about it. The partial
/// file stays for every kind but `.Integrity` (whose file was deleted).
func describeDownloadFailure(_ error: Error, of model: CatalogModel) -> String {
    switch error as? PocketError {
    case .Network(let reason)?:
        return "Network error (\(reason)). What arrived is kept: Download resumes where it stopped."
    case .Integrity(let reason)?:
        return "\(model.name) is not the expected file (\(reason)); the file was deleted. Try again."
    case .Storage(let reason)?:
        return "Not enough space for \(model.name) (\(reason)). Free some space; Download then resumes."
    case .InvalidArgument(let reason)?:
        return "The catalog entry for \(model.name) is wrong: \(reason)"
    default:
        return "Downloading \(model.name) failed: \(error)"
    }
}
