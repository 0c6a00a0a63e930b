package dev.pocket.chat

import androidx.activity.compose.rememberLauncherForActivityResult
import androidx.activity.result.contract.ActivityResultContracts
import androidx.compose.foundation.background
import androidx.compose.foundation.layout.Arrangement
import androidx.compose.foundation.layout.Box
import androidx.compose.foundation.layout.Column
import androidx.compose.foundation.layout.Row
import androidx.compose.foundation.layout.Spacer
import androidx.compose.foundation.layout.fillMaxSize
import androidx.compose.foundation.layout.fillMaxWidth
import androidx.compose.foundation.layout.imePadding
import androidx.compose.foundation.layout.padding
import androidx.compose.foundation.layout.widthIn
import androidx.compose.foundation.lazy.LazyColumn
import androidx.compose.foundation.lazy.items
import androidx.compose.foundation.lazy.rememberLazyListState
import androidx.compose.foundation.shape.RoundedCornerShape
import androidx.compose.material3.Button
import androidx.compose.material3.DropdownMenu
import androidx.compose.material3.DropdownMenuItem
import androidx.compose.material3.ExperimentalMaterial3Api
import androidx.compose.material3.LinearProgressIndicator
import androidx.compose.material3.MaterialTheme
import androidx.compose.material3.OutlinedButton
import androidx.compose.material3.OutlinedTextField
import androidx.compose.material3.Scaffold
import androidx.compose.material3.Text
import androidx.compose.material3.TextButton
import androidx.compose.material3.TopAppBar
import androidx.compose.runtime.Composable
import androidx.compose.runtime.LaunchedEffect
import androidx.compose.runtime.getValue
import androidx.compose.runtime.mutableStateOf
import androidx.compose.runtime.remember
import androidx.compose.runtime.setValue
import androidx.compose.ui.Alignment
import androidx.compose.ui.Modifier
import androidx.compose.ui.text.font.FontWeight
import androidx.compose.ui.unit.dp
import androidx.lifecycle.compose.collectAsStateWithLifecycle

@OptIn(ExperimentalMaterial3Api::class)
@Composable
fun ChatScreen(chat: ChatViewModel) {
    val state by chat.state.collectAsStateWithLifecycle()
    var menuOpen by remember { mutableStateOf(false) }
    var input by remember { mutableStateOf("") }
    val pickFile = rememberLauncherForActivityResult(ActivityResultContracts.OpenDocument()) { uri ->
        uri?.let(chat::loadUri)
    }
    val listState = rememberLazyListState()
    LaunchedEffect(state.turns.size, state.turns.lastOrNull()?.text?.length) {
        if (state.turns.isNotEmpty()) listState.scrollToItem(state.turns.lastIndex)
    }

    Scaffold(
        topBar = {
            TopAppBar(
                title = { Text(state.modelName ?: "Pocket Chat", maxLines = 1) },
                actions = {
                    TextButton(onClick = { menuOpen = true }, enabled = !state.loading) { Text("Model") }
                    DropdownMenu(expanded = menuOpen, onDismissRequest = { menuOpen = false }) {
                        state.assetModels.forEach { name ->
                            DropdownMenuItem(text = { Text("$name (APK asset)") }, onClick = {
                                menuOpen = false
                                chat.loadAsset(name)
                            })
                        }
                        state.downloadedModels.forEach { name ->
                            DropdownMenuItem(text = { Text("$name (downloaded)") }, onClick = {
                                menuOpen = false
                                chat.loadDownloaded(name)
                            })
                        }
                        state.downloadable.forEach { model ->
                            DropdownMenuItem(
                                text = { Text("Download ${model.label}") },
                                enabled = state.download?.running != true,
                                onClick = {
                                    menuOpen = false
                                    chat.startDownload(model)
                                },
                            )
                        }
                        DropdownMenuItem(text = { Text("Open a .gguf file…") }, onClick = {
                            menuOpen = false
                            pickFile.launch(arrayOf("*/*"))
                        })
                        DropdownMenuItem(
                            text = { Text("Summarize (structured)") },
                            enabled = state.turns.isNotEmpty() && !state.generating,
                            onClick = {
                                menuOpen = false
                                chat.summarize()
                            },
                        )
                        DropdownMenuItem(text = { Text("New chat") }, onClick = {
                            menuOpen = false
                            chat.clear()
                        })
                    }
                },
            )
        },
    ) { padding ->
        Column(Modifier.fillMaxSize().padding(padding).imePadding()) {
            if (state.loading) LinearProgressIndicator(Modifier.fillMaxWidth())
            Text(
                state.error ?: state.status,
                color = if (state.error != null) MaterialTheme.colorScheme.error else MaterialTheme.colorScheme.onSurfaceVariant,
                style = MaterialTheme.typography.labelMedium,
                modifier = Modifier.padding(horizontal = 16.dp, vertical = 4.dp),
            )
            state.download?.let { download ->
                DownloadRow(download, cancel = chat::cancelDownload, resume = { chat.startDownload(download.model) })
            }
            if (state.modelName == null && !state.loading && state.download == null && state.turns.isEmpty()) {
                // First launch: nothing to chat with yet.
                NoModel(state, download = chat::startDownload, modifier = Modifier.weight(1f).fillMaxWidth())
            } else {
                LazyColumn(
                    state = listState,
                    modifier = Modifier.weight(1f).fillMaxWidth(),
                    verticalArrangement = Arrangement.spacedBy(8.dp),
                ) {
                    items(state.turns, key = { it.id }) { turn -> Bubble(turn) }
                }
            }
            Row(Modifier.fillMaxWidth().padding(8.dp), verticalAlignment = Alignment.CenterVertically) {
                OutlinedTextField(
                    value = input,
                    onValueChange = { input = it },
                    modifier = Modifier.weight(1f),
                    placeholder = { Text(if (state.modelName == null) "Pick a model first" else "Message") },
                    enabled = state.modelName != null,
                    maxLines = 4,
                )
                if (state.generating) {
                    Button(onClick = chat::stop, modifier = Modifier.padding(start = 8.dp)) { Text("Stop") }
                } else {
                    Button(
                        onClick = {
                            chat.send(input)
                            input = ""
                        },
                        // Not while a model loads: the load clears the turns and replaces the session.
                        enabled = state.modelName != null && !state.loading && input.isNotBlank(),
                        modifier = Modifier.padding(start = 8.dp),
                    ) { Text("Send") }
                }
            }
        }
    }
}

/** The empty chat before any model: the catalog's downloads, prominent, and the other ways in. */
@Composable
private fun NoModel(state: ChatState, download: (CatalogModel) -> Unit, modifier: Modifier = Modifier) {
    Column(
        modifier.padding(16.dp),
        verticalArrangement = Arrangement.spacedBy(12.dp, Alignment.CenterVertically),
        horizontalAlignment = Alignment.CenterHorizontally,
    ) {
        state.downloadable.forEach { model ->
            Button(onClick = { download(model) }) { Text("Download ${model.label}") }
        }
        Text(
            if (state.assetModels.isEmpty() && state.downloadedModels.isEmpty()) {
                "Or open a .gguf file: Model → Open a .gguf file…"
            } else {
                "Or pick a model in the Model menu"
            },
            style = MaterialTheme.typography.bodySmall,
            color = MaterialTheme.colorScheme.onSurfaceVariant,
        )
    }
}

/**
 * A download's progress (MB done of the total) with Cancel while it runs,
 * Resume once it stopped (the partial file is kept).
 */
@Composable
private fun DownloadRow(download: DownloadState, cancel: () -> Unit, resume: () -> Unit) {
    Column(Modifier.fillMaxWidth().padding(horizontal = 16.dp, vertical = 4.dp)) {
        Row(verticalAlignment = Alignment.CenterVertically) {
            Text(download.model.name, style = MaterialTheme.typography.titleSmall)
            Spacer(Modifier.weight(1f))
            if (download.running) {
                OutlinedButton(onClick = cancel) { Text("Cancel") }
            } else {
                OutlinedButton(onClick = resume) { Text(if (download.doneBytes > 0) "Resume" else "Try again") }
            }
        }
        LinearProgressIndicator(progress = { download.fraction }, modifier = Modifier.fillMaxWidth())
        Text(
            if (download.totalBytes > 0) {
                "${megabytes(download.doneBytes)} of ${megabytes(download.totalBytes)}"
            } else {
                megabytes(download.doneBytes)
            },
            style = MaterialTheme.typography.labelSmall,
            color = MaterialTheme.colorScheme.onSurfaceVariant,
        )
    }
}

@Composable
private fun Bubble(turn: Turn) {
    if (turn.role == "tool") {
        // A tool's result, as the app sent it back to the model.
        Text(
            "⏱ ${turn.text}",
            style = MaterialTheme.typography.labelSmall,
            color = MaterialTheme.colorScheme.onSurfaceVariant,
            modifier = Modifier.padding(horizontal = 16.dp),
        )
        return
    }
    val mine = turn.role == "user"
    // The text, and an assistant turn's tool calls.
    val shown = (listOfNotNull(turn.text.ifEmpty { null }) + turn.toolCalls.map { "→ ${it.name}(${it.argumentsJson})" })
        .joinToString("\n")
        .ifEmpty { "…" }
    Box(Modifier.fillMaxWidth().padding(horizontal = 12.dp), contentAlignment = if (mine) Alignment.CenterEnd else Alignment.CenterStart) {
        Text(
            shown,
            modifier = Modifier
                .widthIn(max = 320.dp)
                .background(
                    if (mine) MaterialTheme.colorScheme.primaryContainer else MaterialTheme.colorScheme.surfaceVariant,
                    RoundedCornerShape(12.dp),
                )
                .padding(10.dp),
            fontWeight = if (mine) FontWeight.Medium else FontWeight.Normal,
        )
    }
}
