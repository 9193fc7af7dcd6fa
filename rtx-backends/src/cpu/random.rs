//! Counter-based random masks: element `i` is a pure function of `(seed, i)`, so a mask never
//! depends on how the work was split across threads.

use super::check::{self, KResult};
use super::strided::for_each_chunk;

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijective mix whose every output bit depends on every input bit.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [0, 1) from the top 24 bits, all of which an f32 holds exactly.
fn uniform(key: u64, index: u64) -> f32 {
    let bits = mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)));
    (bits >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

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
    for_each_chunk(&mut mask, |start, piece| {
        for (i, m) in piece.iter_mut().enumerate() {
            *m = if uniform(key, (start + i) as u64) < p {
                0.0
            } else {
                keep_scale
            };
        }
    });
    Ok(mask)
}
