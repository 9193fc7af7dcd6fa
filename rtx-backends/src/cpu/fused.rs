//! The driver of compiler-generated pointwise kernels: walks `N` input layouts of one shape
//! together and writes `M` outputs, calling the generated body once per element.
//!
//! The body is a closure the `graph!` macro emits from a fusion group (a chain such as
//! `relu(x @ w + b) * mask`), so after inlining each group is one loop that reads every input
//! once and writes every output once. Splitting follows the rule of every kernel here: fixed
//! pieces, independent of the thread count.

use rayon::prelude::*;

use super::strided::{CHUNK, PARALLEL_THRESHOLD, Walk, numel};
use crate::layout::Layout;

/// A base pointer shared by the pieces of one parallel loop; each piece writes a disjoint range.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: pieces write disjoint ranges of the buffer (see `map_fused`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `body` applied to every element of `shape`: input `k` is read through `inputs[k]`, whose
/// layout must already have `shape` (broadcast axes have stride 0). Returns `M` contiguous
/// buffers of `shape`.
pub fn map_fused<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    shape: &[usize],
    body: F,
) -> [Vec<f32>; M]
where
    F: Fn([f32; N]) -> [f32; M] + Sync,
{
    let n = numel(shape);
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|_| crate::pool::take(n));
    let ptrs: [OutPtr; M] = std::array::from_fn(|m| OutPtr(outs[m].as_mut_ptr()));
    let walk: Walk<N> = Walk::new(shape, std::array::from_fn(|k| inputs[k].1));
    let data: [&[f32]; N] = std::array::from_fn(|k| inputs[k].0);
    let piece = |start: usize, len: usize| {
        // SAFETY: `start..start + len` lies inside every output buffer (each has `n` elements)
        // and no other piece touches it.
        let mut dst: [&mut [f32]; M] = std::array::from_fn(|m| unsafe {
            std::slice::from_raw_parts_mut(ptrs[m].0.add(start), len)
        });
        walk.runs(
            start,
            len,
            |at, run, pos: [usize; N], strides: [usize; N]| {
                if strides.iter().all(|&s| s == 1) {
                    let src: [&[f32]; N] = std::array::from_fn(|k| &data[k][pos[k]..pos[k] + run]);
                    for i in 0..run {
                        let r = body(std::array::from_fn(|k| src[k][i]));
                        for m in 0..M {
                            dst[m][at + i] = r[m];
                        }
                    }
                } else {
                    for i in 0..run {
                        let r = body(std::array::from_fn(|k| data[k][pos[k] + i * strides[k]]));
                        for m in 0..M {
                            dst[m][at + i] = r[m];
                        }
                    }
                }
            },
        );
    };
    if n <= PARALLEL_THRESHOLD {
        piece(0, n);
    } else {
        (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .for_each(|c| piece(c * CHUNK, CHUNK.min(n - c * CHUNK)));
    }
    outs
}
