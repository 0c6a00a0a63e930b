//! One HTTP GET or HEAD, redirects followed here (never from https to http),
//! failures sorted into those worth retrying and those that are final.
//!
//! ureq (blocking, no async runtime) does the protocol; its own redirect
//! handling is off so that the downgrade rule, the hop limit and the
//! `Authorization` header (kept on the hub's host only) are ours. TLS is
//! rustls on ring with the platform's trust store (feature `tls`).

use std::io::Read;
use std::time::Duration;

use crate::Options;

/// What a response said, after redirects.
#[derive(Clone, Debug, Default)]
pub struct Head {
    pub status: u16,
    /// The URL that answered (after redirects).
    pub url: String,
    pub content_length: Option<u64>,
    /// `Content-Range: bytes START-END/TOTAL` (TOTAL `None` for `*`).
    pub content_range: Option<(u64, u64, Option<u64>)>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    /// `Retry-After` in seconds (503, 429).
    pub retry_after: Option<Duration>,
}

impl Head {
    /// The validator for `If-Range`: a strong ETag, else Last-Modified
    /// (a weak ETag may not be used there).
    pub fn validator(&self) -> Option<String> {
        match &self.etag {
            Some(e) if !e.starts_with("W/") => Some(e.clone()),
            _ => self.last_modified.clone(),
        }
    }
}

/// Why a request failed.
#[derive(Debug)]
pub enum Failure {
    /// Worth retrying: connection refused, reset or timed out, a 5xx, 429.
    Transient { reason: String, retry_after: Option<Duration> },
    /// Retrying would not help: 4xx, a bad URL, a refused redirect, TLS.
    Fatal(String),
}

pub struct Client {
    agent: ureq::Agent,
    max_redirects: u32,
    /// `Authorization: Bearer …` for requests to this host only (the hub's, from HF_TOKEN).
    auth: Option<(String, String)>,
}

pub type Body = Box<dyn Read + Send>;

impl Client {
    pub fn new(opts: &Options, auth: Option<(String, String)>) -> Result<Client, String> {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(opts.connect_timeout))
            .timeout_per_read(Some(opts.read_timeout))
            .timeout_send_request(Some(opts.read_timeout))
            .user_agent(opts.user_agent.as_str())
            // Ranges count bytes of the file as stored: no transfer encoding by the server.
            .accept_encoding("identity")
            .input_buffer_size(256 * 1024);
        if !opts.use_env_proxy {
            config = config.proxy(None);
        }
        #[cfg(feature = "tls")]
        {
            config = config.tls_config(tls::config()?);
        }
        Ok(Client { agent: config.build().new_agent(), max_redirects: opts.max_redirects, auth })
    }

    /// HEAD `url`: its size and validator (a 405 or 501 gives `Ok` with that status).
    pub fn head(&self, url: &str) -> Result<Head, Failure> {
        self.request(url, None, true).map(|(head, _)| head)
    }

    /// GET `url`, from byte `from` on when given (with `If-Range: validator` when there is one).
    pub fn get(&self, url: &str, from: Option<(u64, Option<&str>)>) -> Result<(Head, Body), Failure> {
        self.request(url, from, false)
    }

    fn request(&self, url: &str, from: Option<(u64, Option<&str>)>, head_only: bool) -> Result<(Head, Body), Failure> {
        let mut url = url.to_string();
        for _ in 0..=self.max_redirects {
            check_scheme(&url)?;
            let mut req = if head_only { self.agent.head(&url) } else { self.agent.get(&url) };
            if let Some((offset, validator)) = from {
                req = req.header("Range", format!("bytes={offset}-"));
                if let Some(v) = validator {
                    req = req.header("If-Range", v);
                }
            }
            if let Some((host, token)) = &self.auth {
                if host_of(&url) == Some(host.as_str()) {
                    req = req.header("Authorization", format!("Bearer {token}"));
                }
            }
            let response = req.call().map_err(|e| classify(&url, e))?;
            let status = response.status().as_u16();
            let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let Some(location) = header("location") else {
                    return Err(Failure::Fatal(format!("{url}: HTTP {status} without a Location")));
                };
                let next = join(&url, &location)
                    .ok_or_else(|| Failure::Fatal(format!("{url}: bad redirect to {location:?}")))?;
                if !redirect_allowed(&url, &next) {
                    return Err(Failure::Fatal(format!("{url}: redirect from https to {next} refused")));
                }
                log::debug!("{url}: HTTP {status} to {next}");
                url = next;
                continue;
            }
            let head = Head {
                status,
                url: url.clone(),
                content_length: header("content-length").and_then(|v| v.trim().parse().ok()),
                content_range: header("content-range").and_then(|v| parse_content_range(&v)),
                etag: header("etag"),
                last_modified: header("last-modified"),
                retry_after: header("retry-after").and_then(|v| v.trim().parse().ok()).map(Duration::from_secs),
            };
            match status {
                200..=299 | 416 => {}
                405 | 501 if head_only => {}
                429 | 500..=599 | 408 => {
                    return Err(Failure::Transient {
                        reason: format!("{url}: HTTP {status}"),
                        retry_after: head.retry_after,
                    });
                }
                _ => return Err(Failure::Fatal(format!("{url}: HTTP {status}"))),
            }
            let body: Body = Box::new(response.into_body().into_reader());
            return Ok((head, body));
        }
        Err(Failure::Fatal(format!("{url}: more than {} redirects", self.max_redirects)))
    }
}

/// Never from https to anything else.
fn redirect_allowed(from: &str, to: &str) -> bool {
    let https = |u: &str| u.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("https://"));
    !https(from) || https(to)
}

fn check_scheme(url: &str) -> Result<(), Failure> {
    if url.starts_with("http://") {
        return Ok(());
    }
    if url.starts_with("https://") {
        return if cfg!(feature = "tls") {
            Ok(())
        } else {
            Err(Failure::Fatal(format!("{url}: https needs pocket-download's `tls` feature (this build has none)")))
        };
    }
    Err(Failure::Fatal(format!("{url}: only http:// and https:// URLs can be downloaded")))
}

fn classify(url: &str, e: ureq::Error) -> Failure {
    use ureq::Error as E;
    let transient = matches!(
        e,
        E::Io(_) | E::Timeout(_) | E::HostNotFound | E::ConnectionFailed | E::Protocol(_) | E::StatusCode(500..=599)
    );
    let reason = format!("{url}: {e}");
    if transient {
        Failure::Transient { reason, retry_after: None }
    } else {
        Failure::Fatal(reason)
    }
}

/// `bytes START-END/TOTAL` or `bytes START-END/*`.
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let v = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = v.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let total = if total.trim() == "*" { None } else { Some(total.trim().parse().ok()?) };
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?, total))
}

/// `scheme://host[:port]` of an absolute URL, and its host.
fn origin(url: &str) -> Option<(&str, &str)> {
    let scheme_end = url.find("://")? + 3;
    let rest = &url[scheme_end..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    Some((&url[..scheme_end + end], host))
}

pub fn host_of(url: &str) -> Option<&str> {
    origin(url).map(|(_, host)| host)
}

/// A `Location` resolved against the URL that sent it (RFC 3986, enough of it for redirects).
pub fn join(base: &str, location: &str) -> Option<String> {
    let location = location.trim();
    let scheme = location.split_once(':').map(|(s, _)| s).unwrap_or("");
    let has_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if has_scheme {
        return Some(location.to_string());
    }
    let (origin, _) = origin(base)?;
    if let Some(rest) = location.strip_prefix("//") {
        let scheme = &base[..base.find("://")?];
        return Some(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Some(format!("{origin}{location}"));
    }
    let path_and_more = &base[origin.len()..];
    let path = &path_and_more[..path_and_more.find(['?', '#']).unwrap_or(path_and_more.len())];
    if location.starts_with('?') {
        return Some(format!("{origin}{path}{location}"));
    }
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    Some(format!("{origin}{dir}{location}"))
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use ureq::tls::{RootCerts, TlsConfig, TlsProvider};

    /// rustls on ring, verifying against the platform's trust store.
    pub fn config() -> Result<TlsConfig, String> {
        // ring: no C toolchain beyond the target's compiler (aws-lc-rs also
        // needs CMake); it has no post-quantum key exchange, hence rustls'
        // deprecation of its default provider.
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        Ok(TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(roots()?)
            .unversioned_rustls_crypto_provider(Arc::new(provider))
            .build())
    }

    /// Apple (Security.framework), Linux (the distribution's bundle) and
    /// Windows: the platform verifier.
    #[cfg(not(target_os = "android"))]
    fn roots() -> Result<RootCerts, String> {
        Ok(RootCerts::PlatformVerifier)
    }

    /// Android: the system's CA store as files, read as Go's crypto/x509
    /// does (the Conscrypt APEX's updatable copy first, Android 14+), which is
    /// what an app trusts by default (user-added CAs are not trusted by apps
    /// targeting API 24+ unless their network security config says so). No JNI
    /// set-up is needed, unlike the platform verifier's Android mode.
    #[cfg(target_os = "android")]
    fn roots() -> Result<RootCerts, String> {
        use ureq::tls::{parse_pem, PemItem};
        for dir in ["/apex/com.android.conscrypt/cacerts", "/system/etc/security/cacerts"] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            let mut certs = Vec::new();
            for entry in entries.flatten() {
                let Ok(pem) = std::fs::read(entry.path()) else { continue };
                for item in parse_pem(&pem).flatten() {
                    if let PemItem::Certificate(c) = item {
                        certs.push(c);
                    }
                }
            }
            if !certs.is_empty() {
                log::debug!("{} CA certificates from {dir}", certs.len());
                return Ok(RootCerts::new_with_certs(&certs));
            }
        }
        Err("no CA certificates in the system store (/system/etc/security/cacerts)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_locations_resolve() {
        let base = "http://h:8/a/b/c?x=1";
        assert_eq!(join(base, "https://cdn/x").unwrap(), "https://cdn/x");
        assert_eq!(join(base, "//other/y").unwrap(), "http://other/y");
        assert_eq!(join(base, "/root").unwrap(), "http://h:8/root");
        assert_eq!(join(base, "d").unwrap(), "http://h:8/a/b/d");
        assert_eq!(join(base, "?q").unwrap(), "http://h:8/a/b/c?q");
        assert_eq!(join("http://h", "d").unwrap(), "http://h/d");
        assert_eq!(host_of("https://user@hub.example:443/x"), Some("hub.example:443"));
        assert!(redirect_allowed("https://a/x", "HTTPS://b/y"));
        assert!(redirect_allowed("http://a/x", "https://b/y"));
        assert!(redirect_allowed("http://a/x", "http://b/y"));
        assert!(!redirect_allowed("https://a/x", "http://b/y"));
        assert!(!redirect_allowed("HTTPS://a/x", "ftp://b/y"));
    }

    #[test]
    fn content_ranges_parse() {
        assert_eq!(parse_content_range("bytes 10-19/20"), Some((10, 19, Some(20))));
        assert_eq!(parse_content_range("bytes 0-0/*"), Some((0, 0, None)));
        assert_eq!(parse_content_range("bytes */20"), None);
    }

    #[test]
    fn weak_etags_are_not_validators() {
        let h = Head { etag: Some("W/\"x\"".into()), last_modified: Some("Tue".into()), ..Head::default() };
        assert_eq!(h.validator().as_deref(), Some("Tue"));
        let h = Head { etag: Some("\"x\"".into()), ..Head::default() };
        assert_eq!(h.validator().as_deref(), Some("\"x\""));
    }
}
