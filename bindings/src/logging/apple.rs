//! iOS: the unified logging system (os_log), subsystem "dev.pocket", category "engine".
//!
//! `os_log` is a C macro; what it expands to is a call of `_os_log_impl` with
//! a format string and an argument buffer laid out by clang's
//! `__builtin_os_log_format`. We do the same for the single format
//! `%{public}s`: buffer = summary byte (0x02: has non-scalar items), argument
//! count (1), then the argument: descriptor 0x22 (string kind 2 << 4 | public
//! flag 2), size 8, and the pointer. The format string lives in
//! `__TEXT,__oslogstring` as the macro puts it, since the log reader resolves
//! it against this image (`__dso_handle`).

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

#[repr(C)]
struct OsLogStruct {
    _private: [u8; 0],
}
type OsLog = *mut OsLogStruct;

// os_log_type_t values from <os/log.h>.
const OS_LOG_TYPE_DEFAULT: u8 = 0x00;
const OS_LOG_TYPE_INFO: u8 = 0x01;
const OS_LOG_TYPE_DEBUG: u8 = 0x02;
const OS_LOG_TYPE_ERROR: u8 = 0x10;

extern "C" {
    static __dso_handle: c_void;
    fn os_log_create(subsystem: *const c_char, category: *const c_char) -> OsLog;
    fn os_log_type_enabled(log: OsLog, ty: u8) -> bool;
    fn _os_log_impl(dso: *const c_void, log: OsLog, ty: u8, format: *const c_char, buf: *mut u8, size: u32);
}

#[link_section = "__TEXT,__oslogstring,cstring_literals"]
#[used]
static FORMAT: [u8; 11] = *b"%{public}s\0";

/// An `os_log_t` is an immutable, thread-safe object.
struct Handle(OsLog);
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

struct OsLogger;

fn handle() -> OsLog {
    static LOG: OnceLock<Handle> = OnceLock::new();
    // SAFETY: both arguments are NUL-terminated static strings.
    LOG.get_or_init(|| Handle(unsafe { os_log_create(c"dev.pocket".as_ptr(), c"engine".as_ptr()) })).0
}

impl Log for OsLogger {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }

    fn log(&self, record: &Record) {
        let ty = match record.level() {
            Level::Error => OS_LOG_TYPE_ERROR,
            Level::Warn => OS_LOG_TYPE_DEFAULT,
            Level::Info => OS_LOG_TYPE_INFO,
            Level::Debug | Level::Trace => OS_LOG_TYPE_DEBUG,
        };
        let log = handle();
        // SAFETY: `log` came from os_log_create.
        if log.is_null() || !unsafe { os_log_type_enabled(log, ty) } {
            return;
        }
        let Ok(text) = CString::new(record.args().to_string().replace('\0', "\u{FFFD}")) else { return };
        let mut buf = [0u8; 12];
        buf[0] = 0x02; // summary: has non-scalar items
        buf[1] = 1; // one argument
        buf[2] = 0x22; // string, public
        buf[3] = 8; // pointer size
        buf[4..].copy_from_slice(&(text.as_ptr() as u64).to_le_bytes());
        // SAFETY: the buffer matches the format (one public C string) and
        // `text` outlives the call, which copies what it needs.
        unsafe {
            _os_log_impl(&__dso_handle, log, ty, FORMAT.as_ptr() as *const c_char, buf.as_mut_ptr(), buf.len() as u32)
        };
    }

    fn flush(&self) {}
}

pub(super) fn logger() -> Option<(&'static dyn Log, LevelFilter)> {
    let level = if cfg!(debug_assertions) { LevelFilter::Debug } else { LevelFilter::Info };
    Some((&OsLogger, level))
}
