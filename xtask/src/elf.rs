//! The `LOAD` segments of an ELF shared library, read from its program headers.
//!
//! Android 15+ devices may use 16 KB memory pages. The dynamic loader there
//! refuses a library whose `LOAD` segments are aligned for 4 KB pages, and
//! Google Play rejects apps that ship one; the fix is a link flag
//! (`-z max-page-size=16384`) that leaves its mark in each segment's
//! `p_align`. Reading that field takes a few lines, so the check needs no NDK
//! tools (`llvm-readelf`) and runs wherever `cargo xtask` does.
//! Both classes are read: ELF64 (arm64-v8a, x86_64) and ELF32 (armeabi-v7a).

/// The page size Android's 16 KB devices use, in bytes.
pub const PAGE_16K: u64 = 16 * 1024;

const PT_LOAD: u32 = 1;
/// `e_phnum` when the real count lives in section 0 (never the case for a linked library).
const PN_XNUM: u16 = 0xffff;

/// One `LOAD` segment: where it starts in the file and in memory, and its alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    pub offset: u64,
    pub vaddr: u64,
    pub align: u64,
}

/// The `LOAD` segments of the ELF file `elf`, in program-header order.
pub fn load_segments(elf: &[u8]) -> Result<Vec<Load>, String> {
    if elf.len() < 16 || &elf[..4] != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    let wide = match elf[4] {
        1 => false,
        2 => true,
        c => return Err(format!("unknown ELF class {c}")),
    };
    let r = Reader {
        bytes: elf,
        big_endian: match elf[5] {
            1 => false,
            2 => true,
            d => return Err(format!("unknown ELF data encoding {d}")),
        },
    };
    // e_phoff, e_phentsize and e_phnum, and the size of one program header.
    let (phoff, phentsize, phnum, entry_size) = if wide {
        (r.u64(0x20)?, r.u16(0x36)?, r.u16(0x38)?, 56)
    } else {
        (r.u32(0x1c)?.into(), r.u16(0x2a)?, r.u16(0x2c)?, 32)
    };
    if phnum == PN_XNUM {
        return Err("more than 65534 program headers (PN_XNUM): not a linked library".into());
    }
    if phnum > 0 && usize::from(phentsize) < entry_size {
        return Err(format!("program header size {phentsize} is below the {entry_size} bytes of one entry"));
    }
    let mut loads = Vec::new();
    for i in 0..u64::from(phnum) {
        let at = phoff
            .checked_add(i * u64::from(phentsize))
            .and_then(|a| usize::try_from(a).ok())
            .ok_or("program header offset out of range")?;
        if r.u32(at)? != PT_LOAD {
            continue;
        }
        loads.push(if wide {
            Load { offset: r.u64(at + 8)?, vaddr: r.u64(at + 16)?, align: r.u64(at + 48)? }
        } else {
            Load { offset: r.u32(at + 4)?.into(), vaddr: r.u32(at + 8)?.into(), align: r.u32(at + 28)?.into() }
        });
    }
    if loads.is_empty() {
        return Err("no LOAD segment: not a loadable library".into());
    }
    Ok(loads)
}

/// The `LOAD` segments of `elf` aligned for pages smaller than `page` bytes:
/// empty when the library loads on devices with that page size.
#[cfg(test)]
pub fn misaligned(elf: &[u8], page: u64) -> Result<Vec<Load>, String> {
    Ok(load_segments(elf)?.into_iter().filter(|l| l.align < page).collect())
}

/// Bounds-checked fixed-width reads in the file's byte order.
struct Reader<'a> {
    bytes: &'a [u8],
    big_endian: bool,
}

impl Reader<'_> {
    fn take<const N: usize>(&self, at: usize) -> Result<[u8; N], String> {
        at.checked_add(N)
            .and_then(|end| self.bytes.get(at..end))
            .map(|s| s.try_into().expect("slice of length N"))
            .ok_or_else(|| format!("truncated ELF file ({} bytes, reading {N} at {at})", self.bytes.len()))
    }

    fn u16(&self, at: usize) -> Result<u16, String> {
        let b = self.take(at)?;
        Ok(if self.big_endian { u16::from_be_bytes(b) } else { u16::from_le_bytes(b) })
    }

    fn u32(&self, at: usize) -> Result<u32, String> {
        let b = self.take(at)?;
        Ok(if self.big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
    }

    fn u64(&self, at: usize) -> Result<u64, String> {
        let b = self.take(at)?;
        Ok(if self.big_endian { u64::from_be_bytes(b) } else { u64::from_le_bytes(b) })
    }
}

/// Hand-made ELF images for the tests: just the headers the check reads, laid
/// out as the ELF specification has them (no toolchain needed to make them).
#[cfg(test)]
pub mod fixture {
    /// Machine numbers (`e_machine`) of the three Android ABIs.
    pub const EM_ARM: u16 = 40;
    pub const EM_X86_64: u16 = 62;
    pub const EM_AARCH64: u16 = 183;

    /// A shared library (`ET_DYN`) whose program headers are a `PT_PHDR`, one
    /// `PT_LOAD` per entry of `load_aligns` (read-only then executable, as a
    /// linker lays them out), and a `PT_GNU_STACK`.
    pub fn shared_library(wide: bool, big_endian: bool, machine: u16, load_aligns: &[u64]) -> Vec<u8> {
        let (ehsize, phentsize) = if wide { (64usize, 56usize) } else { (52, 32) };
        let mut headers = vec![(6u32, 4u32, 8u64)]; // PT_PHDR, R, 8-byte aligned
        headers.extend(load_aligns.iter().enumerate().map(|(i, &a)| (1u32, if i % 2 == 0 { 4 } else { 5 }, a)));
        headers.push((0x6474_e551, 6, 16)); // PT_GNU_STACK, RW
        let mut w = Writer { out: Vec::new(), big_endian };

        // e_ident: magic, class, data, version, OS ABI (System V), padding.
        w.out.extend_from_slice(b"\x7fELF");
        w.out.extend_from_slice(&[if wide { 2 } else { 1 }, if big_endian { 2 } else { 1 }, 1, 0]);
        w.out.resize(16, 0);
        w.u16(3); // e_type: ET_DYN
        w.u16(machine);
        w.u32(1); // e_version
        w.word(wide, 0); // e_entry
        w.word(wide, ehsize as u64); // e_phoff: right after this header
        w.word(wide, 0); // e_shoff: no section headers
        w.u32(if machine == EM_ARM { 0x0500_0000 } else { 0 }); // e_flags (ARM EABI version 5)
        w.u16(ehsize as u16);
        w.u16(phentsize as u16);
        w.u16(headers.len() as u16);
        w.u16(if wide { 64 } else { 40 }); // e_shentsize
        w.u16(0); // e_shnum
        w.u16(0); // e_shstrndx
        assert_eq!(w.out.len(), ehsize);

        let page = 0x1_0000u64;
        for (i, &(kind, flags, align)) in headers.iter().enumerate() {
            let (offset, vaddr, size) = match kind {
                6 => (ehsize as u64, ehsize as u64, (headers.len() * phentsize) as u64),
                1 => (i as u64 * page, i as u64 * page, 0x100),
                _ => (0, 0, 0),
            };
            if wide {
                w.u32(kind);
                w.u32(flags);
                w.u64(offset);
                w.u64(vaddr);
                w.u64(vaddr); // p_paddr
                w.u64(size); // p_filesz
                w.u64(size); // p_memsz
                w.u64(align);
            } else {
                w.u32(kind);
                w.u32(offset as u32);
                w.u32(vaddr as u32);
                w.u32(vaddr as u32);
                w.u32(size as u32);
                w.u32(size as u32);
                w.u32(flags);
                w.u32(align as u32);
            }
        }
        assert_eq!(w.out.len(), ehsize + headers.len() * phentsize);
        w.out
    }

    struct Writer {
        out: Vec<u8>,
        big_endian: bool,
    }

    impl Writer {
        fn u16(&mut self, v: u16) {
            self.out.extend_from_slice(&if self.big_endian { v.to_be_bytes() } else { v.to_le_bytes() });
        }

        fn u32(&mut self, v: u32) {
            self.out.extend_from_slice(&if self.big_endian { v.to_be_bytes() } else { v.to_le_bytes() });
        }

        fn u64(&mut self, v: u64) {
            self.out.extend_from_slice(&if self.big_endian { v.to_be_bytes() } else { v.to_le_bytes() });
        }

        /// An address or offset: 8 bytes in ELF64, 4 in ELF32.
        fn word(&mut self, wide: bool, v: u64) {
            if wide {
                self.u64(v)
            } else {
                self.u32(v as u32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::{shared_library, EM_AARCH64, EM_ARM, EM_X86_64};
    use super::*;

    #[test]
    fn elf64_segments_are_read_in_order() {
        let so = shared_library(true, false, EM_AARCH64, &[0x4000, 0x10000]);
        let loads = load_segments(&so).unwrap();
        assert_eq!(
            loads,
            [
                Load { offset: 0x10000, vaddr: 0x10000, align: 0x4000 },
                Load { offset: 0x20000, vaddr: 0x20000, align: 0x10000 }
            ]
        );
        assert!(misaligned(&so, PAGE_16K).unwrap().is_empty());
    }

    #[test]
    fn elf32_segments_are_read_in_order() {
        let so = shared_library(false, false, EM_ARM, &[0x4000, 0x1000]);
        let loads = load_segments(&so).unwrap();
        assert_eq!(loads.iter().map(|l| l.align).collect::<Vec<_>>(), [0x4000, 0x1000]);
        assert_eq!(misaligned(&so, PAGE_16K).unwrap(), [Load { offset: 0x20000, vaddr: 0x20000, align: 0x1000 }]);
    }

    #[test]
    fn big_endian_files_are_read_in_their_byte_order() {
        for wide in [false, true] {
            let so = shared_library(wide, true, EM_AARCH64, &[0x1000]);
            assert_eq!(load_segments(&so).unwrap()[0].align, 0x1000, "wide={wide}");
        }
    }

    #[test]
    fn one_small_segment_among_aligned_ones_is_found() {
        let so = shared_library(true, false, EM_X86_64, &[0x4000, 0x4000, 0x1000, 0x4000]);
        let bad = misaligned(&so, PAGE_16K).unwrap();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].offset, 0x30000);
    }

    #[test]
    fn not_elf_truncated_or_unloadable_is_an_error() {
        assert!(load_segments(b"PK\x03\x04 a zip, not a library").unwrap_err().contains("not an ELF"));
        let so = shared_library(true, false, EM_AARCH64, &[0x4000]);
        // Cut inside the LOAD entry's p_align (the last entry, PT_GNU_STACK, is 56 bytes).
        let cut = &so[..so.len() - 56 - 4];
        assert!(load_segments(cut).unwrap_err().contains("truncated"), "{:?}", load_segments(cut));
        let mut odd_class = so.clone();
        odd_class[4] = 3;
        assert!(load_segments(&odd_class).unwrap_err().contains("class"));
        let none = shared_library(false, false, EM_ARM, &[]);
        assert!(load_segments(&none).unwrap_err().contains("no LOAD"));
    }
}
