//! F32/F16/BF16 and the 32-element formats. (Being written.)
pub(super) fn todo(_: &[f32], _: Option<&[f32]>, _: &mut [u8]) {
    unimplemented!("quantiser being written")
}
pub(super) use todo as f32;
pub(super) use todo as f16;
pub(super) use todo as bf16;
pub(super) use todo as q4_0;
pub(super) use todo as q4_1;
pub(super) use todo as q5_0;
pub(super) use todo as q5_1;
pub(super) use todo as q8_0;
