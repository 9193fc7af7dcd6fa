//! Walking layouts in row-major order, and the parallel-split policy shared by the kernels.

use std::borrow::Cow;
use std::sync::Mutex;

use rayon::prelude::*;

use crate::layout::{Dims, Layout};

use super::check::{self, KResult};

/// Below this many output elements a kernel stays on the calling thread: a rayon fork/join
/// costs microseconds, which would dominate the small tensors (batch 64, 8x8 images) these
/// models use.
pub(crate) const PARALLEL_THRESHOLD: usize = 32 * 1024;

/// Piece size for parallel elementwise work. It is a constant, so the split never depends on
/// the thread count.
pub(crate) const CHUNK: usize = 16 * 1024;

/// Runs `task(0)` .. `task(tasks - 1)` on rayon's pool. Not generic, on purpose: the fused
/// drivers are instantiated once per generated kernel body, and a `par_iter` inside them
/// brought rayon's whole splitting machinery along with every instantiation (a fifth of the
/// `models` crate's code); one dynamic call per task (thousands of elements) costs nothing.
pub(crate) fn for_each_task(tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    (0..tasks).into_par_iter().for_each(task);
}

/// Runs `fill(start, piece)` over `out`, where `piece` is `out[start..start + piece.len()]`:
/// once on the calling thread for small outputs, else over fixed-size pieces in parallel.
pub(crate) fn for_each_chunk(out: &mut [f32], fill: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() <= PARALLEL_THRESHOLD {
        fill(0, out);
    } else {
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, piece)| fill(i * CHUNK, piece));
    }
}

/// Copies the elements of `l` into a fresh row-major buffer.
pub fn to_contiguous(data: &[f32], l: &Layout) -> KResult<Vec<f32>> {
    const K: &str = "to_contiguous";
    check::view(K, "data", data.len(), l)?;
    check::elements(K, &l.shape)?;
    Ok(contiguous(data, l))
}

/// [`to_contiguous`] into `out`, which must hold exactly the layout's elements (a compiled
/// call's arena region).
pub fn to_contiguous_into(data: &[f32], l: &Layout, out: &mut [f32]) -> KResult<()> {
    const K: &str = "to_contiguous";
    check::view(K, "data", data.len(), l)?;
    let n = check::elements(K, &l.shape)?;
    check::argument(K, out.len() == n, || {
        format!("an output buffer of {n} values, got {}", out.len())
    })?;
    if n > 0 && l.is_contiguous() {
        out.copy_from_slice(&data[l.offset..l.offset + n]);
    } else if n > 0 {
        map_strided_into(data, l, |v| v, out);
    }
    Ok(())
}

/// [`to_contiguous`] of a layout the caller checked against `data`.
pub(crate) fn contiguous(data: &[f32], l: &Layout) -> Vec<f32> {
    match contiguous_cow(data, l) {
        Cow::Borrowed(run) => {
            let mut out = crate::pool::take(run.len());
            out.copy_from_slice(run);
            out
        }
        Cow::Owned(out) => out,
    }
}

/// The elements of `l` in row-major order, borrowed when the buffer already holds them so.
/// The caller checked `l` against `data`.
pub(crate) fn contiguous_cow<'a>(data: &'a [f32], l: &Layout) -> Cow<'a, [f32]> {
    if l.numel() == 0 {
        // An empty view's offset may lie past the buffer's end.
        Cow::Borrowed(&[])
    } else if l.is_contiguous() {
        Cow::Borrowed(&data[l.offset..l.offset + l.numel()])
    } else {
        Cow::Owned(map_strided(data, l, |v| v))
    }
}

/// `f` applied to every element of `l`, in row-major order. The caller checked `l` against `x`.
pub(crate) fn map_strided<F: Fn(f32) -> f32 + Sync>(x: &[f32], l: &Layout, f: F) -> Vec<f32> {
    let mut out = crate::pool::take(l.numel());
    map_strided_into(x, l, f, &mut out);
    out
}

/// [`map_strided`] into `out` of `l.numel()` values.
fn map_strided_into<F: Fn(f32) -> f32 + Sync>(x: &[f32], l: &Layout, f: F, out: &mut [f32]) {
    let walk = Walk::new(&l.shape, [l]);
    for_each_chunk(out, |start, piece| {
        walk.runs(start, piece.len(), |at, len, [pos], [stride]| {
            let dst = &mut piece[at..at + len];
            if stride == 1 {
                for (d, &v) in dst.iter_mut().zip(&x[pos..pos + len]) {
                    *d = f(v);
                }
            } else {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = f(x[pos + i * stride]);
                }
            }
        });
    });
}

/// Idle f64 scratch vectors, shared by all threads. A kernel's scratch is taken here for the
/// kernel's length and put back after: the driving thread of a call varies from call to call,
/// and a per-thread vector would first grow on each thread at whatever step that thread
/// first ran a reduction, i.e. allocate after warm-up.
static F64_SCRATCH: Mutex<Vec<Vec<f64>>> = Mutex::new(Vec::new());

/// Runs `f` on an f64 scratch vector (contents unspecified), kept between calls so kernels
/// that collect per-row partial sums allocate nothing after warm-up. Nested or concurrent
/// calls get vectors of their own.
pub(crate) fn with_f64_scratch<R>(f: impl FnOnce(&mut Vec<f64>) -> R) -> R {
    let mut scratch = F64_SCRATCH
        .lock()
        .ok()
        .and_then(|mut idle| idle.pop())
        .unwrap_or_default();
    let result = f(&mut scratch);
    if let Ok(mut idle) = F64_SCRATCH.lock() {
        if idle.capacity() == 0 {
            idle.reserve(16);
        }
        if idle.len() < idle.capacity() {
            idle.push(scratch);
        }
    }
    result
}

/// Product of a shape's sizes (1 for a scalar).
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Buffer position of row-major index `linear` of `shape` under `strides` (offset excluded).
pub(crate) fn position(mut linear: usize, shape: &[usize], strides: &[usize]) -> usize {
    let mut pos = 0;
    for axis in (0..shape.len()).rev() {
        pos += (linear % shape[axis]) * strides[axis];
        linear /= shape[axis];
    }
    pos
}

/// Walks `K` layouts of one shape together in row-major order, handing out runs along the
/// innermost axis so kernels get tight inner loops instead of a per-element index update.
pub(crate) struct Walk<const K: usize> {
    shape: Dims,
    strides: [Dims; K],
    offsets: [usize; K],
}

impl<const K: usize> Walk<K> {
    /// `layouts` all have shape `shape` (broadcast them first where needed). Axes that every
    /// layout stores back to back are merged, so contiguous data becomes one long run.
    pub(crate) fn new(shape: &[usize], layouts: [&Layout; K]) -> Self {
        let mut merged_shape = Dims::new();
        let mut merged_strides: [Dims; K] = std::array::from_fn(|_| Dims::new());
        // Built innermost first, so `last()` is the outermost axis merged so far.
        for axis in (0..shape.len()).rev() {
            let size = shape[axis];
            if size == 1 {
                continue;
            }
            let mergeable = merged_shape.last().is_some_and(|&inner_size| {
                (0..K).all(|k| {
                    merged_strides[k].last().map(|&s| s * inner_size)
                        == Some(layouts[k].strides[axis])
                })
            });
            if mergeable {
                if let Some(inner_size) = merged_shape.last_mut() {
                    *inner_size *= size;
                }
            } else {
                merged_shape.push(size);
                for k in 0..K {
                    merged_strides[k].push(layouts[k].strides[axis]);
                }
            }
        }
        if merged_shape.is_empty() {
            merged_shape.push(1);
            for strides in &mut merged_strides {
                strides.push(0);
            }
        }
        merged_shape.reverse();
        for strides in &mut merged_strides {
            strides.reverse();
        }
        Walk {
            shape: merged_shape,
            strides: merged_strides,
            offsets: std::array::from_fn(|k| layouts[k].offset),
        }
    }

    /// Visits row-major elements `start..start + len` as runs along the innermost axis, calling
    /// `f(at, run_len, positions, inner_strides)`: `at` counts from `start`, and run element `i`
    /// of layout `k` sits at `positions[k] + i * inner_strides[k]`.
    pub(crate) fn runs(
        &self,
        start: usize,
        len: usize,
        mut f: impl FnMut(usize, usize, [usize; K], [usize; K]),
    ) {
        if len == 0 {
            return;
        }
        let last = self.shape.len() - 1;
        let inner = self.shape[last];
        let inner_strides: [usize; K] = std::array::from_fn(|k| self.strides[k][last]);
        let mut counter: Dims = smallvec::smallvec![0; self.shape.len()];
        let mut rest = start;
        for axis in (0..self.shape.len()).rev() {
            counter[axis] = rest % self.shape[axis];
            rest /= self.shape[axis];
        }
        let mut pos: [usize; K] = std::array::from_fn(|k| {
            self.offsets[k]
                + counter
                    .iter()
                    .zip(&self.strides[k])
                    .map(|(c, s)| c * s)
                    .sum::<usize>()
        });
        let mut done = 0;
        loop {
            let run = (inner - counter[last]).min(len - done);
            f(done, run, pos, inner_strides);
            done += run;
            if done == len {
                return;
            }
            // The run ended at the end of the innermost axis: rewind it and carry outward.
            for (p, inner_stride) in pos.iter_mut().zip(inner_strides) {
                *p -= counter[last] * inner_stride;
            }
            counter[last] = 0;
            let mut axis = last;
            loop {
                axis -= 1;
                counter[axis] += 1;
                for (p, strides) in pos.iter_mut().zip(&self.strides) {
                    *p += strides[axis];
                }
                if counter[axis] < self.shape[axis] {
                    break;
                }
                for (p, strides) in pos.iter_mut().zip(&self.strides) {
                    *p -= strides[axis] * self.shape[axis];
                }
                counter[axis] = 0;
            }
        }
    }
}
