//! SHA-256 whose state can be saved and restored at block boundaries, so that
//! a resumed download re-reads only what came after the last saved state.
//!
//! The compression function is `sha2`'s (it picks SHA-NI on x86-64 and the
//! ARMv8 SHA instructions on arm64 at run time: several GB/s, where a
//! portable one manages a few hundred MB/s); the buffering, padding and the
//! saved form are here, since `sha2` does not expose a midstate.

use sha2::block_api::compress256;

const H0: [u32; 8] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// A running SHA-256.
#[derive(Clone)]
pub struct Sha256 {
    h: [u32; 8],
    /// Bytes compressed into `h` (a multiple of 64).
    compressed: u64,
    buf: [u8; 64],
    buf_len: usize,
}

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256 {
    pub fn new() -> Self {
        Sha256 { h: H0, compressed: 0, buf: [0; 64], buf_len: 0 }
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.compressed + self.buf_len as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn update(&mut self, mut data: &[u8]) {
        if self.buf_len > 0 {
            let take = (64 - self.buf_len).min(data.len());
            self.buf[self.buf_len..self.buf_len + take].copy_from_slice(&data[..take]);
            self.buf_len += take;
            data = &data[take..];
            if self.buf_len < 64 {
                return;
            }
            compress256(&mut self.h, &[self.buf]);
            self.compressed += 64;
            self.buf_len = 0;
        }
        let (blocks, rest) = data.as_chunks::<64>();
        if !blocks.is_empty() {
            compress256(&mut self.h, blocks);
            self.compressed += 64 * blocks.len() as u64;
        }
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buf_len = rest.len();
    }

    pub fn finish(mut self) -> [u8; 32] {
        let bits = self.len().wrapping_mul(8);
        let mut tail = [0u8; 128];
        tail[..self.buf_len].copy_from_slice(&self.buf[..self.buf_len]);
        tail[self.buf_len] = 0x80;
        let n = if self.buf_len < 56 { 64 } else { 128 };
        tail[n - 8..n].copy_from_slice(&bits.to_be_bytes());
        let (blocks, _) = tail[..n].as_chunks::<64>();
        compress256(&mut self.h, blocks);
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(self.h) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// The state at the last block boundary, as text (`LEN:H0H1…H7` in hex),
    /// and that boundary: what a resumed download restarts hashing from.
    pub fn checkpoint(&self) -> (u64, String) {
        let h: String = self.h.iter().map(|w| format!("{w:08x}")).collect();
        (self.compressed, format!("{}:{h}", self.compressed))
    }

    /// The hasher a [`checkpoint`](Self::checkpoint) describes.
    pub fn restore(text: &str) -> Option<Sha256> {
        let (len, h) = text.split_once(':')?;
        let compressed: u64 = len.parse().ok()?;
        if !compressed.is_multiple_of(64) || h.len() != 64 || !h.is_ascii() {
            return None;
        }
        let mut state = [0u32; 8];
        for (i, w) in state.iter_mut().enumerate() {
            *w = u32::from_str_radix(&h[i * 8..i * 8 + 8], 16).ok()?;
        }
        Some(Sha256 { h: state, compressed, buf: [0; 64], buf_len: 0 })
    }
}

/// 64 lowercase hex digits.
pub fn to_hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits (either case) to bytes.
pub fn from_hex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(data: &[u8]) -> String {
        let mut h = Sha256::new();
        h.update(data);
        to_hex(&h.finish())
    }

    #[test]
    fn known_answers() {
        // FIPS 180-4 examples and the empty string.
        assert_eq!(hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(hex(&[b'a'; 1_000_000]), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }

    #[test]
    fn any_split_and_a_checkpoint_give_the_same_digest() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = hex(&data);
        for cut in [0, 1, 55, 56, 63, 64, 65, 127, 128, 500, 999, 1000] {
            let mut h = Sha256::new();
            h.update(&data[..cut]);
            // Save at the block boundary, restore, re-hash what followed it.
            let (at, saved) = h.checkpoint();
            let mut r = Sha256::restore(&saved).unwrap();
            assert_eq!(r.len(), at);
            r.update(&data[at as usize..]);
            assert_eq!(to_hex(&r.finish()), whole, "cut {cut}");
            h.update(&data[cut..]);
            assert_eq!(to_hex(&h.finish()), whole, "cut {cut}");
        }
        assert!(Sha256::restore("63:00").is_none());
        assert_eq!(from_hex(&whole).map(|d| to_hex(&d)), Some(whole.clone()));
        assert_eq!(from_hex(&whole.to_uppercase()).map(|d| to_hex(&d)), Some(whole));
        assert!(from_hex("abc").is_none());
    }
}
