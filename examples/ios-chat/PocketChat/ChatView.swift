import SwiftUI
import UniformTypeIdentifiers

struct ChatView: View {
    let chat: ChatModel
    @State private var input = ""
    @State private var importing = false

    var body: some View {
        NavigationStack {
            VStack(spacing: 0) {
                if chat.isLoading {
                    ProgressView().padding(.vertical, 4)
                }
                Text(chat.errorText ?? chat.status)
                    .font(.caption)
                    .foregroundStyle(chat.errorText == nil ? Color.secondary : Color.red)
                    .frame(maxWidth: .infinity, alignment: .leading)
                    .padding(.horizontal)
                    .padding(.vertical, 4)
                if let download = chat.download {
                    DownloadRow(download: download, cancel: { chat.cancelDownload() }) {
                        chat.startDownload(download.model)
                    }
                }
                ScrollViewReader { proxy in
                    ScrollView {
                        LazyVStack(spacing: 8) {
                            ForEach(chat.turns) { turn in
                                Bubble(turn: turn).id(turn.id)
                            }
                        }
                        .padding(.horizontal)
                    }
                    .onChange(of: chat.turns.last?.text) {
                        if let last = chat.turns.last { proxy.scrollTo(last.id, anchor: .bottom) }
                    }
                    .overlay {
                        // First launch: nothing to chat with yet.
                        if chat.modelName == nil && !chat.isLoading && chat.download == nil && chat.turns.isEmpty {
                            NoModel(chat: chat)
                        }
                    }
                }
                HStack {
                    TextField(chat.modelName == nil ? "Pick a model first" : "Message", text: $input, axis: .vertical)
                        .textFieldStyle(.roundedBorder)
                        .lineLimit(1...4)
                        .disabled(chat.modelName == nil)
                    if chat.isGenerating {
                        Button("Stop", role: .destructive) { chat.stop() }
                            .buttonStyle(.borderedProminent)
                    } else {
                        Button("Send") {
                            chat.send(input)
                            input = ""
                        }
                        .buttonStyle(.borderedProminent)
                        // Not while a model loads: the load replaces the session and clears the turns.
                        .disabled(chat.modelName == nil || chat.isLoading || input.trimmingCharacters(in: .whitespaces).isEmpty)
                    }
                }
                .padding()
            }
            .navigationTitle(chat.modelName ?? "Pocket Chat")
            .navigationBarTitleDisplayMode(.inline)
            .toolbar {
                ToolbarItem(placement: .topBarTrailing) {
                    Menu("Model") {
                        ForEach(chat.available, id: \.self) { url in
                            Button(url.lastPathComponent) { chat.load(url) }
                        }
                        ForEach(chat.downloadable) { model in
                            Button("Download \(model.label)") { chat.startDownload(model) }
                                .disabled(chat.download?.isRunning == true)
                        }
                        Button("Import from Files…") { importing = true }
                        Button("Refresh list") { chat.refreshAvailable() }
                        Button("Summarize (structured)") { chat.summarize() }
                            .disabled(chat.turns.isEmpty || chat.isGenerating)
                        Button("New chat") { chat.newChat() }
                    }
                    .disabled(chat.isLoading)
                }
            }
            .fileImporter(isPresented: $importing, allowedContentTypes: [UTType(filenameExtension: "gguf") ?? .data, .data]) { result in
                if case .success(let url) = result {
                    chat.load(url, securityScoped: true)
                }
            }
        }
    }
}

/// The empty chat before any model: the catalog's downloads, prominent,
/// and the other ways in.
private struct NoModel: View {
    let chat: ChatModel

    var body: some View {
        VStack(spacing: 12) {
            ForEach(chat.downloadable) { model in
                Button("Download \(model.label)") { chat.startDownload(model) }
                    .buttonStyle(.borderedProminent)
                    .controlSize(.large)
            }
            Text(chat.available.isEmpty
                 ? "Or import a .gguf file: Model → Import from Files…"
                 : "Or pick a model in the Model menu")
                .font(.footnote)
                .foregroundStyle(.secondary)
        }
        .padding()
    }
}

/// A download's progress (MB done of the total) with Cancel while it runs,
/// Resume once it stopped (the partial file is kept).
private struct DownloadRow: View {
    let download: ChatModel.Download
    let cancel: () -> Void
    let resume: () -> Void

    /// 0 until the server gave the size.
    private var fraction: Double {
        download.totalBytes > 0 ? min(Double(download.doneBytes) / Double(download.totalBytes), 1) : 0
    }

    var body: some View {
        VStack(alignment: .leading, spacing: 4) {
            HStack {
                Text(download.model.name).font(.subheadline.weight(.semibold))
                Spacer()
                if download.isRunning {
                    Button("Cancel", role: .cancel, action: cancel)
                } else {
                    Button(download.doneBytes > 0 ? "Resume" : "Try again", action: resume)
                }
            }
            ProgressView(value: fraction)
            Text(download.totalBytes > 0
                 ? "\(megabytes(download.doneBytes)) of \(megabytes(download.totalBytes))"
                 : "\(megabytes(download.doneBytes))")
                .font(.caption)
                .foregroundStyle(.secondary)
        }
        .padding(.horizontal)
        .padding(.vertical, 6)
    }
}

private struct Bubble: View {
    let turn: Turn

    /// The text, and an assistant turn's tool calls.
    private var shown: String {
        let calls = turn.toolCalls.map { "→ \($0.name)(\($0.argumentsJson))" }
        let parts = (turn.text.isEmpty ? [] : [turn.text]) + calls
        return parts.isEmpty ? "…" : parts.joined(separator: "\n")
    }

    var body: some View {
        if turn.role == "tool" {
            // A tool's result, as the app sent it back to the model.
            Label(turn.text, systemImage: "clock")
                .font(.caption)
                .foregroundStyle(.secondary)
                .frame(maxWidth: .infinity, alignment: .leading)
        } else {
            message
        }
    }

    private var message: some View {
        let mine = turn.role == "user"
        return HStack {
            if mine { Spacer(minLength: 40) }
            Text(shown)
                .padding(10)
                .background(mine ? Color.accentColor.opacity(0.2) : Color(.secondarySystemBackground))
                .clipShape(RoundedRectangle(cornerRadius: 12))
                .textSelection(.enabled)
            if !mine { Spacer(minLength: 40) }
        }
    }
}
