//! Run-time choice of the vector width for the loops the compiler generates.
//!
//! A binary built for baseline x86-64 compiles every loop for SSE2 (4 lanes). The fused
//! pointwise bodies, row kernels and matmul epilogues that `graph!` emits are plain Rust
//! loops, so [`widest`] runs them inside a function compiled with `#[target_feature]` for the
//! widest instruction set this CPU has: the body (an `#[inline(always)]` closure) is inlined
//! there and LLVM vectorizes it for AVX2 (8 lanes) or AVX-512 (16 lanes). Results do not
//! depend on the choice: each lane does the same IEEE operations in the same order (Rust
//! never contracts `a * b + c` into a fused multiply-add on its own), so the level is a speed
//! setting only (tests force each level and compare bits).
//!
//! The hand-written SIMD kernels (GEMM, attention, random numbers) pick their own code path;
//! this module only widens compiler-vectorized loops.

use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction set the generated loops can be compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// The build's own target (SSE2 on x86-64, NEON on aarch64).
    Baseline,
    /// AVX2 with FMA (x86-64).
    Avx2,
    /// AVX-512 F/BW/DQ/VL (x86-64).
    Avx512,
}

impl SimdLevel {
    fn name(self) -> &'static str {
        match self {
            SimdLevel::Baseline => "baseline",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    fn from_u8(v: u8) -> Option<SimdLevel> {
        match v {
            1 => Some(SimdLevel::Baseline),
            2 => Some(SimdLevel::Avx2),
            3 => Some(SimdLevel::Avx512),
            _ => None,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            SimdLevel::Baseline => 1,
            SimdLevel::Avx2 => 2,
            SimdLevel::Avx512 => 3,
        }
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this CPU runs code compiled for `level`.
pub fn simd_supported(level: SimdLevel) -> bool {
    match level {
        SimdLevel::Baseline => true,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vl")
                && simd_supported(SimdLevel::Avx2)
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    }
}

/// Every level this CPU runs, the widest last.
pub fn simd_levels() -> Vec<SimdLevel> {
    [SimdLevel::Baseline, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|&l| simd_supported(l))
        .collect()
}

/// 0: not chosen yet; otherwise `SimdLevel::to_u8`.
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The level the generated loops run at: the widest this CPU has, or the one the environment
/// variable `RTX_SIMD` names (`baseline`, `avx2`, `avx512`) when this CPU has it, or the one
/// [`set_simd_level`] chose last.
pub fn simd_level() -> SimdLevel {
    if let Some(level) = SimdLevel::from_u8(LEVEL.load(Ordering::Relaxed)) {
        return level;
    }
    let forced = match std::env::var("RTX_SIMD").as_deref() {
        Ok("baseline") => Some(SimdLevel::Baseline),
        Ok("avx2") => Some(SimdLevel::Avx2),
        Ok("avx512") => Some(SimdLevel::Avx512),
        _ => None,
    };
    let level = forced
        .filter(|&l| simd_supported(l))
        .or_else(|| simd_levels().last().copied())
        .unwrap_or(SimdLevel::Baseline);
    LEVEL.store(level.to_u8(), Ordering::Relaxed);
    level
}

/// Makes the generated loops run at `level` from now on (for tests and benchmarks that
/// compare levels); `false`, and nothing changed, when this CPU lacks it.
pub fn set_simd_level(level: SimdLevel) -> bool {
    if !simd_supported(level) {
        return false;
    }
    LEVEL.store(level.to_u8(), Ordering::Relaxed);
    true
}

/// Runs `f` compiled for the current [`simd_level`]. `f` should be an `#[inline(always)]`
/// closure (or call only `#[inline(always)]` code) so that its loops are compiled inside the
/// wider function rather than called from it.
#[inline(always)]
pub(crate) fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match simd_level() {
        // SAFETY: `simd_level` only returns a level this CPU supports (`simd_supported`).
        SimdLevel::Avx512 => return unsafe { x86::avx512(f) },
        // SAFETY: as above.
        SimdLevel::Avx2 => return unsafe { x86::avx2(f) },
        SimdLevel::Baseline => {}
    }
    f()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// # Safety
    /// The CPU must support every feature enabled here.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,avx,fma")]
    pub(super) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// # Safety
    /// The CPU must support every feature enabled here.
    #[target_feature(enable = "avx2,avx,fma")]
    pub(super) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}
