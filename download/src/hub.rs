//! The hub form `hf://OWNER/REPO/FILE[@REVISION]`.
//!
//! It names the hub's `resolve` URL, `{endpoint}/OWNER/REPO/resolve/{REVISION or main}/FILE`,
//! with the endpoint from `HF_ENDPOINT` when set (the hub clients' convention,
//! which also lets tests point it at a local server), else https://huggingface.co.
//! `HF_TOKEN`, when set, is sent to the endpoint's host only (gated repositories).

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The URL a download fetches: `hf://…` resolved against `endpoint`, anything else unchanged.
pub fn resolve_with(url: &str, endpoint: &str) -> Result<String, String> {
    let Some(rest) = url.strip_prefix("hf://") else { return Ok(url.to_string()) };
    let bad = || format!("{url}: expected hf://OWNER/REPO/FILE[@REVISION]");
    let mut it = rest.splitn(3, '/');
    let (Some(owner), Some(repo), Some(file)) = (it.next(), it.next(), it.next()) else { return Err(bad()) };
    // The revision follows the last '@' of the file part (a branch, tag or commit).
    let (file, revision) = match file.rsplit_once('@') {
        Some((f, r)) if !r.is_empty() => (f, r),
        Some(_) => return Err(bad()),
        None => (file, "main"),
    };
    if [owner, repo, file].iter().any(|s| s.is_empty() || s.split('/').any(|seg| seg.is_empty() || seg == "..")) {
        return Err(bad());
    }
    let endpoint = endpoint.trim_end_matches('/');
    Ok(format!(
        "{endpoint}/{}/{}/resolve/{}/{}",
        encode(owner, false),
        encode(repo, false),
        encode(revision, true),
        encode(file, false)
    ))
}

/// [`resolve_with`] the endpoint from `HF_ENDPOINT`, else the public hub.
pub fn resolve(url: &str) -> Result<String, String> {
    resolve_with(url, &endpoint())
}

pub fn endpoint() -> String {
    std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty()).unwrap_or_else(|| DEFAULT_ENDPOINT.into())
}

/// The hub token and the host it goes to, for `hf://` URLs.
pub fn auth() -> Option<(String, String)> {
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty())?;
    let endpoint = endpoint();
    let host = crate::http::host_of(&endpoint)?.to_string();
    Some((host, token.trim().to_string()))
}

/// Percent-encode a path (or, with `slash`, a single segment: `refs/pr/1` → `refs%2Fpr%2F1`).
fn encode(s: &str, slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (b == b'/' && !slash);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_urls_resolve() {
        let e = "https://huggingface.co";
        assert_eq!(
            resolve_with("hf://unsloth/Qwen3-GGUF/q/model-00001-of-00003.gguf", e).unwrap(),
            "https://huggingface.co/unsloth/Qwen3-GGUF/resolve/main/q/model-00001-of-00003.gguf"
        );
        assert_eq!(
            resolve_with("hf://o/r/f.gguf@v1.0", "http://127.0.0.1:9/").unwrap(),
            "http://127.0.0.1:9/o/r/resolve/v1.0/f.gguf"
        );
        assert_eq!(
            resolve_with("hf://o/r/a b.gguf@refs/pr/1", e).unwrap(),
            "https://huggingface.co/o/r/resolve/refs%2Fpr%2F1/a%20b.gguf"
        );
        assert_eq!(resolve_with("http://x/y", e).unwrap(), "http://x/y");
        for bad in ["hf://o/r", "hf://o//f", "hf://o/r/f@", "hf://o/r/../f", "hf:///r/f"] {
            assert!(resolve_with(bad, e).is_err(), "{bad}");
        }
    }
}
