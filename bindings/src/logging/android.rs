//! Android: logcat through liblog, and the JNI entry point.
//!
//! UniFFI's Kotlin bindings load the library through JNA, which does not call
//! `JNI_OnLoad`; the Kotlin layer (`Pocket.init()` in `PocketAndroid.kt`)
//! calls `System.loadLibrary` first so that it runs. Constructors install the
//! logger too, so logging works either way.

use std::ffi::{c_char, c_int, c_void, CString};

use jni::sys::{jint, JavaVM, JNI_VERSION_1_6};
use log::{Level, LevelFilter, Log, Metadata, Record};

#[link(name = "log")]
extern "C" {
    fn __android_log_write(prio: c_int, tag: *const c_char, text: *const c_char) -> c_int;
}

// android/log.h priorities.
const ANDROID_LOG_VERBOSE: c_int = 2;
const ANDROID_LOG_DEBUG: c_int = 3;
const ANDROID_LOG_INFO: c_int = 4;
const ANDROID_LOG_WARN: c_int = 5;
const ANDROID_LOG_ERROR: c_int = 6;

struct Logcat;

impl Log for Logcat {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        let prio = match record.level() {
            Level::Error => ANDROID_LOG_ERROR,
            Level::Warn => ANDROID_LOG_WARN,
            Level::Info => ANDROID_LOG_INFO,
            Level::Debug => ANDROID_LOG_DEBUG,
            Level::Trace => ANDROID_LOG_VERBOSE,
        };
        // Interior NULs would cut the message: replace them.
        let text = record.args().to_string().replace('\0', "\u{FFFD}");
        if let Ok(text) = CString::new(text) {
            // SAFETY: both strings are NUL-terminated and outlive the call.
            unsafe { __android_log_write(prio, c"Pocket".as_ptr(), text.as_ptr()) };
        }
    }

    fn flush(&self) {}
}

pub(super) fn logger() -> Option<(&'static dyn Log, LevelFilter)> {
    let level = if cfg!(debug_assertions) { LevelFilter::Debug } else { LevelFilter::Info };
    Some((&Logcat, level))
}

/// Called by the JVM when `System.loadLibrary("pocket_ffi")` loads the library.
///
/// # Safety
/// Called by the JVM only, with its own `JavaVM` pointer.
#[no_mangle]
pub unsafe extern "system" fn JNI_OnLoad(vm: *mut JavaVM, _reserved: *mut c_void) -> jint {
    super::init();
    log::debug!("pocket_ffi loaded (JavaVM {vm:p})");
    JNI_VERSION_1_6
}
