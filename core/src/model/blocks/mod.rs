//! The blocks every architecture is built from. Each is its weights (and
//! shape) as `self`, called as `forward(&pass, [state,] scratch, input,
//! output)`: what it reads and writes is in the call, its scratch is its own
//! (kept per sequence in [`super::state::Scratch`]), and its heavy operations
//! go through the pass's [`super::pass::Backend`].

pub mod attention;
pub mod deltanet;
pub mod ffn;
pub mod gemma4;
pub mod local_routing;
pub mod mamba2;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod shortconv;
pub mod yarn;
