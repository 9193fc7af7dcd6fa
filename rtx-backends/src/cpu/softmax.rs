//! Softmax and log-softmax along one axis, with their gradients.
//!
//! A tensor is viewed as `[outer, len, inner]` around the axis; each "lane" is the `len`
//! elements at one (outer, inner) position, `inner` apart. Sums over a lane run in f64 in lane
//! order, and a whole `len * inner` block goes to one task.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::layout::Layout;

use super::strided::{PARALLEL_THRESHOLD, contiguous_cow, numel};

/// The `len` positions of one lane within its block.
#[derive(Clone, Copy)]
struct Lane {
    start: usize,
    stride: usize,
    len: usize,
}

impl Lane {
    fn positions(self) -> impl Iterator<Item = usize> {
        (0..self.len).map(move |i| self.start + i * self.stride)
    }

    fn max(self, x: &[f32]) -> f32 {
        self.positions()
            .map(|p| x[p])
            .fold(f32::NEG_INFINITY, f32::max)
    }

    fn sum(self, f: impl Fn(usize) -> f64) -> f64 {
        self.positions().map(f).sum()
    }
}

/// Runs `lane_kernel(inputs, out, lane)` for every lane along `axis`; the slices it receives are
/// the lane's block (`len * inner` elements) of each input, made contiguous, and of the output.
fn along_axis<const K: usize>(
    inputs: [(&[f32], &Layout); K],
    axis: usize,
    lane_kernel: impl Fn([&[f32]; K], &mut [f32], Lane) + Sync + Send,
) -> Vec<f32> {
    let shape = &inputs[0].1.shape;
    let len = shape[axis];
    let inner = numel(&shape[axis + 1..]);
    let block = len * inner;
    let mut out = crate::pool::take_zeroed(numel(shape));
    if block == 0 {
        return out;
    }
    let contiguous: [Cow<[f32]>; K] =
        std::array::from_fn(|k| contiguous_cow(inputs[k].0, inputs[k].1));
    let run_block = |index: usize, out_block: &mut [f32]| {
        let in_blocks: [&[f32]; K] =
            std::array::from_fn(|k| &contiguous[k][index * block..(index + 1) * block]);
        for start in 0..inner {
            lane_kernel(
                in_blocks,
                out_block,
                Lane {
                    start,
                    stride: inner,
                    len,
                },
            );
        }
    };
    if out.len() > PARALLEL_THRESHOLD {
        out.par_chunks_mut(block)
            .enumerate()
            .for_each(|(i, b)| run_block(i, b));
    } else {
        out.chunks_mut(block)
            .enumerate()
            .for_each(|(i, b)| run_block(i, b));
    }
    out
}

pub fn softmax(x: &[f32], l: &Layout, axis: usize) -> Vec<f32> {
    along_axis([(x, l)], axis, |[x], out, lane| {
        // Shifting by the max keeps exp from overflowing; it cancels in the ratio.
        let max = lane.max(x);
        let mut total = 0.0f64;
        for p in lane.positions() {
            let e = (x[p] - max).exp();
            out[p] = e;
            total += e as f64;
        }
        for p in lane.positions() {
            out[p] = (out[p] as f64 / total) as f32;
        }
    })
}

pub fn log_softmax(x: &[f32], l: &Layout, axis: usize) -> Vec<f32> {
    along_axis([(x, l)], axis, |[x], out, lane| {
        let max = lane.max(x);
        let log_total = max as f64 + lane.sum(|p| ((x[p] - max).exp()) as f64).ln();
        for p in lane.positions() {
            out[p] = (x[p] as f64 - log_total) as f32;
        }
    })
}

/// y = softmax output, g = upstream grad: y * (g - sum(g*y, axis))
pub fn softmax_grad(y: &[f32], ly: &Layout, g: &[f32], lg: &Layout, axis: usize) -> Vec<f32> {
    along_axis([(y, ly), (g, lg)], axis, |[y, g], out, lane| {
        let dot = lane.sum(|p| g[p] as f64 * y[p] as f64);
        for p in lane.positions() {
            out[p] = (y[p] as f64 * (g[p] as f64 - dot)) as f32;
        }
    })
}

/// y = log_softmax output: g - exp(y) * sum(g, axis)
pub fn log_softmax_grad(y: &[f32], ly: &Layout, g: &[f32], lg: &Layout, axis: usize) -> Vec<f32> {
    along_axis([(y, ly), (g, lg)], axis, |[y, g], out, lane| {
        let total = lane.sum(|p| g[p] as f64);
        for p in lane.positions() {
            out[p] = (g[p] as f64 - (y[p] as f64).exp() * total) as f32;
        }
    })
}
