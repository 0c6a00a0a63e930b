import SwiftUI

@main
struct PocketChatApp: App {
    @State private var chat = ChatModel()
    @Environment(\.scenePhase) private var scenePhase

    var body: some Scene {
        WindowGroup {
            ChatView(chat: chat)
        }
        // In the background iOS may end the app at any moment: save the chat
        // now, and the next launch continues it (ChatModel restores it); a
        // model download stops, keeping its partial file. Back in the
        // foreground, the model's memory budget follows what is available
        // again and the stopped download resumes.
        .onChange(of: scenePhase) { _, phase in
            if phase == .background {
                chat.saveForBackground()
                chat.pauseDownloadForBackground()
            } else if phase == .active {
                chat.becameActive()
            }
        }
    }
}
