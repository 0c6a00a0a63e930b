//! MXFP4. (Being written.)
pub(super) fn mxfp4(_: &[f32], _: Option<&[f32]>, _: &mut [u8]) {
    unimplemented!("quantiser being written")
}
