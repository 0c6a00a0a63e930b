//! Free space on the file system that holds a folder (std has no statvfs).

use std::path::Path;

/// Bytes an unprivileged process may still write under `dir`; `None` where unknown.
#[cfg(unix)]
pub fn available(dir: &Path) -> Option<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid C string and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(not(unix))]
pub fn available(_dir: &Path) -> Option<u64> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    #[test]
    fn the_temp_folder_has_some_space() {
        let free = super::available(&std::env::temp_dir()).unwrap();
        assert!(free > 0);
        assert!(super::available(std::path::Path::new("/no/such/folder")).is_none());
    }
}
