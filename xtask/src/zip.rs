//! Reading files out of a zip archive (an AAR or an APK), enough for the
//! 16 KB page check: the central directory, stored and deflated entries.
//! Zip64 archives and encrypted entries are refused with a message; an AAR
//! or APK is neither.

const END_OF_CENTRAL_DIRECTORY: u32 = 0x0605_4b50;
const CENTRAL_ENTRY: u32 = 0x0201_4b50;
const LOCAL_HEADER: u32 = 0x0403_4b50;
const STORED: u16 = 0;
const DEFLATED: u16 = 8;

/// The files of `archive` whose name `wanted` accepts, as (name, contents), in directory order.
pub fn extract(archive: &[u8], wanted: impl Fn(&str) -> bool) -> Result<Vec<(String, Vec<u8>)>, String> {
    let end = find_end(archive)?;
    let count = u16_at(archive, end + 10)?;
    let mut at = u32_at(archive, end + 16)? as usize;
    if count == 0xffff || at == 0xffff_ffff {
        return Err("zip64 archive: not supported".into());
    }
    let mut files = Vec::new();
    for _ in 0..count {
        if u32_at(archive, at)? != CENTRAL_ENTRY {
            return Err(format!("corrupt central directory at byte {at}"));
        }
        let flags = u16_at(archive, at + 8)?;
        let method = u16_at(archive, at + 10)?;
        let packed = u32_at(archive, at + 20)? as usize;
        let size = u32_at(archive, at + 24)? as usize;
        let name_len = usize::from(u16_at(archive, at + 28)?);
        let skip = usize::from(u16_at(archive, at + 30)?) + usize::from(u16_at(archive, at + 32)?);
        let local = u32_at(archive, at + 42)? as usize;
        let name = String::from_utf8_lossy(bytes(archive, at + 46, name_len)?).into_owned();
        at += 46 + name_len + skip;
        if name.ends_with('/') || !wanted(&name) {
            continue;
        }
        if flags & 1 != 0 {
            return Err(format!("{name}: encrypted entry"));
        }
        if packed == 0xffff_ffff || size == 0xffff_ffff || local == 0xffff_ffff {
            return Err(format!("{name}: zip64 entry, not supported"));
        }
        // The data follows the local header, whose name and extra field may differ in length.
        if u32_at(archive, local)? != LOCAL_HEADER {
            return Err(format!("{name}: no local header at byte {local}"));
        }
        let start = local + 30 + usize::from(u16_at(archive, local + 26)?) + usize::from(u16_at(archive, local + 28)?);
        let data = bytes(archive, start, packed)?;
        let contents = match method {
            STORED => data.to_vec(),
            DEFLATED => miniz_oxide::inflate::decompress_to_vec_with_limit(data, size)
                .map_err(|e| format!("{name}: corrupt deflate stream ({e:?})"))?,
            m => return Err(format!("{name}: compression method {m} not supported")),
        };
        if contents.len() != size {
            return Err(format!("{name}: {} bytes unpacked, the directory says {size}", contents.len()));
        }
        files.push((name, contents));
    }
    Ok(files)
}

/// The end-of-central-directory record: the last 22 bytes, or earlier when the archive has a comment.
fn find_end(archive: &[u8]) -> Result<usize, String> {
    let last = archive.len().checked_sub(22).ok_or("not a zip archive (too short)")?;
    let first = last.saturating_sub(0xffff);
    (first..=last)
        .rev()
        .find(|&at| u32_at(archive, at) == Ok(END_OF_CENTRAL_DIRECTORY))
        .ok_or_else(|| "not a zip archive (no end of central directory)".into())
}

fn bytes(archive: &[u8], at: usize, len: usize) -> Result<&[u8], String> {
    at.checked_add(len)
        .and_then(|end| archive.get(at..end))
        .ok_or_else(|| format!("truncated zip archive at byte {at}"))
}

fn u16_at(archive: &[u8], at: usize) -> Result<u16, String> {
    Ok(u16::from_le_bytes(bytes(archive, at, 2)?.try_into().expect("2 bytes")))
}

fn u32_at(archive: &[u8], at: usize) -> Result<u32, String> {
    Ok(u32::from_le_bytes(bytes(archive, at, 4)?.try_into().expect("4 bytes")))
}

/// Writing archives for the tests, laid out as PKWARE's APPNOTE describes
/// (CRC-32 left zero: the reader does not check it).
#[cfg(test)]
pub mod fixture {
    /// A zip archive of `files` (name, contents, deflate?), with an archive comment.
    pub fn archive(files: &[(&str, &[u8], bool)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut directory = Vec::new();
        for &(name, contents, deflate) in files {
            let (method, data) = if deflate {
                (8u16, miniz_oxide::deflate::compress_to_vec(contents, 6))
            } else {
                (0, contents.to_vec())
            };
            let local = out.len() as u32;
            // The local header carries a 4-byte extra field the directory lacks, as aligners write.
            out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
            header(&mut out, method, data.len(), contents.len(), name, 4);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&[0xfe, 0xca, 0, 0]);
            out.extend_from_slice(&data);

            directory.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
            directory.extend_from_slice(&20u16.to_le_bytes()); // version made by
            header(&mut directory, method, data.len(), contents.len(), name, 0);
            directory.extend_from_slice(&[0; 6]); // comment length, disk, internal attributes
            directory.extend_from_slice(&0u32.to_le_bytes()); // external attributes
            directory.extend_from_slice(&local.to_le_bytes());
            directory.extend_from_slice(name.as_bytes());
        }
        let start = out.len() as u32;
        let comment = b"made by a test";
        out.extend_from_slice(&directory);
        out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        out.extend_from_slice(&[0; 4]); // disk numbers
        out.extend_from_slice(&(files.len() as u16).to_le_bytes());
        out.extend_from_slice(&(files.len() as u16).to_le_bytes());
        out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&(comment.len() as u16).to_le_bytes());
        out.extend_from_slice(comment);
        out
    }

    /// The fields local headers and directory entries share, from "version needed" to the extra length.
    fn header(out: &mut Vec<u8>, method: u16, packed: usize, size: usize, name: &str, extra: u16) {
        out.extend_from_slice(&20u16.to_le_bytes()); // version needed
        out.extend_from_slice(&0u16.to_le_bytes()); // flags
        out.extend_from_slice(&method.to_le_bytes());
        out.extend_from_slice(&[0; 4]); // time, date
        out.extend_from_slice(&0u32.to_le_bytes()); // CRC-32
        out.extend_from_slice(&(packed as u32).to_le_bytes());
        out.extend_from_slice(&(size as u32).to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&extra.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_and_deflated_entries_come_back_whole() {
        let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let zip = fixture::archive(&[
            ("AndroidManifest.xml", b"<manifest/>", false),
            ("jni/", b"", false),
            ("jni/arm64-v8a/libpocket_ffi.so", &big, true),
            ("classes.jar", b"not wanted", true),
            ("jni/x86_64/libpocket_ffi.so", b"small", false),
        ]);
        let files = extract(&zip, |n| n.ends_with(".so")).unwrap();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["jni/arm64-v8a/libpocket_ffi.so", "jni/x86_64/libpocket_ffi.so"]);
        assert_eq!(files[0].1, big);
        assert_eq!(files[1].1, b"small");
    }

    #[test]
    fn damaged_archives_are_errors() {
        assert!(extract(b"not a zip at all, just some text", |_| true).unwrap_err().contains("not a zip"));
        let zip = fixture::archive(&[("a.so", &[1; 1000], true)]);
        // The entry's data cut short: the directory (at the end) survives, the data does not.
        let mut cut = zip.clone();
        let data_start = 30 + "a.so".len() + 4;
        cut.drain(data_start + 5..data_start + 20);
        assert!(extract(&cut, |_| true).is_err());
    }
}
