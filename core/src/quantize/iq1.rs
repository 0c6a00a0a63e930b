//! IQ1_S and IQ1_M. (Being written.)
pub(super) fn iq1_s(_: &[f32], _: Option<&[f32]>, _: &mut [u8]) {
    unimplemented!("quantiser being written")
}
pub(super) fn iq1_m(_: &[f32], _: Option<&[f32]>, _: &mut [u8]) {
    unimplemented!("quantiser being written")
}
