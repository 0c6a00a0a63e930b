import SwiftUI

@main
struct PocketChatApp: App {
    @State private var chat = ChatModel()

    var body: some Scene {
        WindowGroup {
            ChatView(chat: chat)
        }
    }
}
