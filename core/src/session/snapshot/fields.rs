//! Little-endian fields inside a section's payload: appended by the writer,
//! taken back in the same order by [`Fields`], which refuses a payload that
//! ends early or has bytes left over.

use super::container::invalid;
use crate::error::Result;

pub fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u128(out: &mut Vec<u8>, v: u128) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    out.reserve(4 * v.len());
    v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

pub fn put_u64s(out: &mut Vec<u8>, v: &[u64]) {
    out.reserve(8 * v.len());
    v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

pub fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(4 * v.len());
    v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

/// A payload being read, field by field.
pub struct Fields<'a> {
    bytes: &'a [u8],
    /// The section, for messages.
    what: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(bytes: &'a [u8], what: &'a str) -> Fields<'a> {
        Fields { bytes, what }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.bytes.len() {
            return Err(invalid(format!("{} ends early", self.what)));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    pub fn u128(&mut self) -> Result<u128> {
        self.array().map(u128::from_le_bytes)
    }

    /// `n` u32s (the length is checked before anything is allocated).
    pub fn u32s(&mut self, n: usize) -> Result<Vec<u32>> {
        let b = self.take(n.checked_mul(4).ok_or_else(|| invalid(format!("{}: count {n} overflows", self.what)))?)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// Fill `dst` with u64s.
    pub fn u64s_into(&mut self, dst: &mut [u64]) -> Result<()> {
        let b = self.take(8 * dst.len())?;
        for (d, c) in dst.iter_mut().zip(b.chunks_exact(8)) {
            *d = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        }
        Ok(())
    }

    /// Fill `dst` with f32s.
    pub fn f32s_into(&mut self, dst: &mut [f32]) -> Result<()> {
        let b = self.take(4 * dst.len())?;
        for (d, c) in dst.iter_mut().zip(b.chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    /// The payload must be used up.
    pub fn finish(self) -> Result<()> {
        if !self.bytes.is_empty() {
            return Err(invalid(format!("{} has {} bytes too many", self.what, self.bytes.len())));
        }
        Ok(())
    }
}
