package dev.pocket.chat

import android.os.Bundle
import androidx.activity.ComponentActivity
import androidx.activity.compose.setContent
import androidx.activity.enableEdgeToEdge
import androidx.activity.viewModels
import androidx.compose.material3.MaterialTheme

class MainActivity : ComponentActivity() {
    private val chat: ChatViewModel by viewModels()

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        enableEdgeToEdge()
        setContent {
            MaterialTheme {
                ChatScreen(chat)
            }
        }
    }

    /** No longer visible: Android may end the process from here on without notice. */
    override fun onStart() {
        super.onStart()
        chat.onForeground()
    }

    override fun onStop() {
        super.onStop()
        chat.saveForBackground()
    }
}
