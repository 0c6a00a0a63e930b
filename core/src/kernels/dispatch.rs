//! Which instruction set the kernels use, chosen once at start-up.
//!
//! Every path fills the same [`Kernels`] table (see [`super::table`]);
//! detection runs once (a `OnceLock`), `POCKET_ISA` may force a lower path,
//! and tests and benchmarks can ask for any path the CPU has with
//! [`Kernels::for_isa`].

use super::simd;
use super::table::{Isa, Kernels};
use std::sync::OnceLock;

impl Kernels {
    /// The path chosen at start-up: the best the CPU has, or `POCKET_ISA`.
    pub fn selected() -> &'static Kernels {
        let all = available();
        &all[*SELECTED.get_or_init(|| {
            let isas: Vec<Isa> = all.iter().map(|k| k.isa).collect();
            select(&isas, std::env::var("POCKET_ISA").ok().as_deref())
        })]
    }

    /// The path `isa`, if this CPU (and this build's architecture) has it.
    pub fn for_isa(isa: Isa) -> Option<&'static Kernels> {
        available().iter().find(|k| k.isa == isa)
    }
}

static AVAILABLE: OnceLock<Vec<Kernels>> = OnceLock::new();
static SELECTED: OnceLock<usize> = OnceLock::new();

/// Every path this CPU can run, scalar first, best last.
fn available() -> &'static [Kernels] {
    AVAILABLE.get_or_init(|| {
        let mut all = vec![Kernels::SCALAR];
        all.extend(simd::detected());
        all
    })
}

/// Index in `available` of the path to use: the best, or `want` (the value of
/// `POCKET_ISA`) when the CPU has it; otherwise a warning and the best.
fn select(available: &[Isa], want: Option<&str>) -> usize {
    let best = available.len() - 1;
    let Some(want) = want else { return best };
    match Isa::from_name(want) {
        Some(isa) => available.iter().position(|&a| a == isa).unwrap_or_else(|| {
            log::warn!("POCKET_ISA={want}: this CPU lacks it; using {}", available[best]);
            best
        }),
        None => {
            let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
            log::warn!("POCKET_ISA={want} is not one of {}; using {}", names.join("|"), available[best]);
            best
        }
    }
}

/// The instruction-set path the kernels run on.
pub fn isa() -> Isa {
    Kernels::selected().isa
}

/// Every path this CPU can run, scalar first.
pub fn available_isas() -> Vec<Isa> {
    available().iter().map(|k| k.isa).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pocket_isa_forces_an_available_path_only() {
        let avail = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni];
        assert_eq!(select(&avail, None), 2);
        assert_eq!(select(&avail, Some("scalar")), 0);
        assert_eq!(select(&avail, Some("AVX2")), 1);
        assert_eq!(select(&avail, Some("i8mm")), 2, "missing path: the best instead");
        assert_eq!(select(&avail, Some("sse9")), 2, "unknown name: the best instead");
        for isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
            assert_eq!(isa.to_string(), isa.name());
        }
        // Every path this CPU reports has a table, scalar first.
        assert_eq!(available_isas()[0], Isa::Scalar);
        assert!(available_isas().iter().all(|&i| Kernels::for_isa(i).is_some_and(|k| k.isa() == i)));
    }
}
