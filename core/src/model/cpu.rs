//! The CPU backend: the kernels of [`crate::kernels`] on the worker pool,
//! the reference every other [`Backend`] is tested against.

use super::blocks::{attention, deltanet};
use super::pass::{Attend, Backend, DeltaRule, Pass};
use super::ssm::Ssm;
use crate::kernels::{self, MatJob};
use crate::threads::ThreadPool;
use crate::Result;

/// The CPU: the blocks' own implementations of the backend's operations.
pub struct Cpu;

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn matmul(&self, pool: &ThreadPool, jobs: &mut [MatJob<'_>]) {
        match jobs {
            // One product over all its rows skips the batch's bookkeeping.
            [MatJob { w, x, rows: None, out }] => kernels::matmul(pool, w, x, out),
            _ => kernels::matmul_batch(pool, jobs),
        }
    }

    fn attend(&self, pass: &Pass, a: &Attend<'_>, out: &mut [f32], scratch: &mut Vec<f32>) {
        attention::attend_cpu(pass, a, out, scratch)
    }

    fn delta_rule(
        &self,
        pass: &Pass,
        d: &DeltaRule<'_>,
        state: &mut Ssm,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        deltanet::delta_rule_cpu(pass, d, state.host_mut()?, out, scratch);
        Ok(())
    }
}
