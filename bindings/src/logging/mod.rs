//! Where the engine's `log` records go: os_log on iOS, logcat on Android,
//! and on other platforms stderr only when `POCKET_LOG` names a level
//! (`error`, `warn`, `info`, `debug`, `trace`); otherwise nowhere.
//!
//! [`init`] installs the logger once; every constructor calls it, and on
//! Android `JNI_OnLoad` does too. An app that installed its own `log` logger
//! keeps it.

use std::sync::Once;

#[cfg(target_os = "android")]
mod android;
#[cfg(target_os = "ios")]
mod apple;
#[cfg(not(any(target_os = "android", target_os = "ios")))]
mod stderr;

#[cfg(target_os = "android")]
use android as platform;
#[cfg(target_os = "ios")]
use apple as platform;
#[cfg(not(any(target_os = "android", target_os = "ios")))]
use stderr as platform;

/// Install the platform logger (idempotent, cheap after the first call).
pub(crate) fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Some((logger, level)) = platform::logger() {
            if log::set_logger(logger).is_ok() {
                log::set_max_level(level);
            }
        }
    });
}
