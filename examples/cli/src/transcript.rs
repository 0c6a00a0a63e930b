//! `pocket chat --session FILE`: the conversation kept across runs. The
//! session snapshot (`FILE`, core's crash-safe format) holds the evaluated
//! state; the messages that rendered it sit beside it in `FILE.messages.json`,
//! so the next turn renders the same prefix and only its new tokens are
//! evaluated.

use std::path::{Path, PathBuf};

use pocket_core::chat::ChatMessage;
use pocket_core::session::Session;
use serde_json::{json, Value};

/// The messages file beside a snapshot.
fn messages_path(snapshot: &Path) -> PathBuf {
    let mut p = snapshot.as_os_str().to_owned();
    p.push(".messages.json");
    PathBuf::from(p)
}

/// Save the session to `path` and the messages beside it (each written to a
/// temporary file and renamed over the old one).
pub fn save(session: &Session, history: &[ChatMessage], path: &Path) -> Result<(), String> {
    session.save(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let msgs: Vec<Value> = history.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
    let target = messages_path(path);
    let tmp = target.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&msgs).map_err(|e| e.to_string())?)
        .and_then(|_| std::fs::rename(&tmp, &target))
        .map_err(|e| format!("{}: {e}", target.display()))
}

/// Restore the session from `path` and return the messages saved beside it;
/// on any error the session is unchanged.
pub fn load(session: &mut Session, path: &Path) -> Result<Vec<ChatMessage>, String> {
    let target = messages_path(path);
    let text = std::fs::read_to_string(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let msgs: Vec<Value> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", target.display()))?;
    let history = msgs
        .iter()
        .map(|m| match (m["role"].as_str(), m["content"].as_str()) {
            (Some(r), Some(c)) => Ok(ChatMessage::new(r, c)),
            _ => Err(format!("{}: a message without role and content", target.display())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    session.load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(history)
}
