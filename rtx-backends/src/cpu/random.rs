//! Counter-based random masks: element `i` is a pure function of `(seed, i)`, so a mask never
//! depends on how the work was split across threads.

use super::check::{self, KResult};
use rayon::prelude::*;

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijective mix whose every output bit depends on every input bit.
#[inline(always)]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) from the top 24 bits, all of which an f32 holds exactly.
#[inline(always)]
fn uniform(key: u64, index: u64) -> f32 {
    let bits = mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)));
    (bits >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// Elements per parallel piece of a dropout mask.
const MASK_PIECE: usize = 4 * 1024;

/// Dropout mask of `numel` elements: 0.0 with probability p, else 1/(1-p). Counter-based (e.g. splitmix64 or Philox-like hash of (seed, index)) so the result depends only on (seed, numel, p), never on thread count. p == 0 gives all ones; p must be finite and in [0, 1).
pub fn dropout_mask(numel: usize, p: f32, seed: u64) -> KResult<Vec<f32>> {
    check::argument(
        "dropout_mask",
        p.is_finite() && (0.0..1.0).contains(&p),
        || format!("the drop probability {p} is not in [0, 1)"),
    )?;
    // The seed is used as is: element i must be `rtx_ir::reference::dropout_uniform(seed, i)`,
    // bit for bit. Nearby seeds still give unrelated masks, since every bit of `mix64`'s output
    // depends on every bit of its input.
    let key = seed;
    let keep_scale = 1.0 / (1.0 - p);
    let mut mask = crate::pool::take(numel);
    let fill = fill_for_cpu();
    // Hashing costs a few cycles per element, ten times a copy: split from `MASK_PIECE`
    // elements up, not from the elementwise kernels' threshold. Pieces of a fixed size, so
    // the split never depends on the thread count (nor would the values: element i is a
    // function of i).
    if mask.len() <= MASK_PIECE {
        fill(key, 0, p, keep_scale, &mut mask);
    } else {
        mask.par_chunks_mut(MASK_PIECE)
            .enumerate()
            .for_each(|(i, piece)| fill(key, i * MASK_PIECE, p, keep_scale, piece));
    }
    Ok(mask)
}

type Fill = fn(u64, usize, f32, f32, &mut [f32]);

/// The mask loop compiled for the widest vectors this CPU has: the 64-bit multiplies of the
/// hash vectorize with AVX-512DQ (and, emulated, with AVX2), where the baseline build does
/// them one at a time. The integer arithmetic is the same, so every build gives the same bits.
fn fill_for_cpu() -> Fill {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq") {
            // SAFETY: the CPU has AVX-512F and AVX-512DQ (checked just above).
            return |k, s, p, keep, piece| unsafe { fill_avx512(k, s, p, keep, piece) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return |k, s, p, keep, piece| unsafe { fill_avx2(k, s, p, keep, piece) };
        }
    }
    fill_mask
}

/// Element `start + i` of the mask into `piece[i]`.
#[inline(always)]
fn fill_mask(key: u64, start: usize, p: f32, keep_scale: f32, piece: &mut [f32]) {
    for (i, m) in piece.iter_mut().enumerate() {
        *m = if uniform(key, (start + i) as u64) < p {
            0.0
        } else {
            keep_scale
        };
    }
}

/// # Safety
/// The CPU has AVX-512F and AVX-512DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn fill_avx512(key: u64, start: usize, p: f32, keep_scale: f32, piece: &mut [f32]) {
    fill_mask(key, start, p, keep_scale, piece)
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_avx2(key: u64, start: usize, p: f32, keep_scale: f32, piece: &mut [f32]) {
    fill_mask(key, start, p, keep_scale, piece)
}
