//! Kernels that move rows and blocks: concat, the narrow gradient, embedding gather/scatter,
//! picking one element per row (labels) and its gradient.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::layout::Layout;

use super::check::{self, KResult, KernelError};
use super::strided::{PARALLEL_THRESHOLD, contiguous_cow, numel, position};

/// Runs `fill(index, block)` over the `block_len`-sized blocks of `out`.
fn for_each_block(
    out: &mut [f32],
    block_len: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if block_len == 0 {
        return;
    }
    if out.len() > PARALLEL_THRESHOLD {
        out.par_chunks_mut(block_len)
            .enumerate()
            .for_each(|(i, block)| fill(i, block));
    } else {
        out.chunks_mut(block_len)
            .enumerate()
            .for_each(|(i, block)| fill(i, block));
    }
}

/// Concatenate along axis (shapes agree off the axis). Returns (out, out_shape).
/// The caller passes at least one input.
pub fn concat(inputs: &[(&[f32], &Layout)], axis: usize) -> (Vec<f32>, crate::layout::Dims) {
    let mut out_shape = inputs[0].1.shape.clone();
    out_shape[axis] = inputs.iter().map(|(_, l)| l.shape[axis]).sum();
    let inner = numel(&out_shape[axis + 1..]);
    // Seen as [outer, len, inner], each input contributes one run of len_i * inner per outer index.
    let parts: smallvec::SmallVec<[(Cow<[f32]>, usize); 4]> = inputs
        .iter()
        .map(|&(data, l)| (contiguous_cow(data, l), l.shape[axis] * inner))
        .collect();
    let mut out = crate::pool::take_zeroed(numel(&out_shape));
    for_each_block(&mut out, out_shape[axis] * inner, |outer, block| {
        let mut at = 0;
        for (part, run) in &parts {
            block[at..at + run].copy_from_slice(&part[outer * run..(outer + 1) * run]);
            at += run;
        }
    });
    (out, out_shape)
}

/// Backward of narrow: zeros of full shape (g's shape with axis size full_len) with g written at start..start+len on axis.
pub fn pad_narrow(g: &[f32], lg: &Layout, axis: usize, start: usize, full_len: usize) -> Vec<f32> {
    let inner = numel(&lg.shape[axis + 1..]);
    let run = lg.shape[axis] * inner;
    let outer = numel(&lg.shape[..axis]);
    let g = contiguous_cow(g, lg);
    let mut out = crate::pool::take_zeroed(outer * full_len * inner);
    for_each_block(&mut out, full_len * inner, |index, block| {
        block[start * inner..start * inner + run]
            .copy_from_slice(&g[index * run..(index + 1) * run]);
    });
    out
}

/// Embedding lookup: table [V, D], ids any shape (caller checked 0 <= id < V) -> ids.shape + [D]
pub fn gather_rows(table: &[f32], lt: &Layout, ids: &[i64]) -> Vec<f32> {
    let dim = lt.shape[1];
    let [row_stride, col_stride] = [lt.strides[0], lt.strides[1]];
    let mut out = crate::pool::take_zeroed(ids.len() * dim);
    // Rows are read through the strides: the table may be far larger than the rows looked up.
    for_each_block(&mut out, dim, |i, dst| {
        let start = lt.offset + ids[i] as usize * row_stride;
        if col_stride == 1 {
            dst.copy_from_slice(&table[start..start + dim]);
        } else {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = table[start + j * col_stride];
            }
        }
    });
    out
}

/// Backward: zeros [V, D], add g rows (g is ids.len() x D, contiguous order of ids) into rows ids[i]. Deterministic.
pub fn scatter_add_rows(g: &[f32], lg: &Layout, ids: &[i64], vocab: usize) -> Vec<f32> {
    let dim = lg.shape.last().copied().unwrap_or(1);
    let g = contiguous_cow(g, lg);
    let mut out = crate::pool::take_zeroed(vocab * dim);
    if dim == 0 {
        return out;
    }
    if ids.len() * dim <= PARALLEL_THRESHOLD {
        for (i, &id) in ids.iter().enumerate() {
            let dst = &mut out[id as usize * dim..(id as usize + 1) * dim];
            for (d, &v) in dst.iter_mut().zip(&g[i * dim..(i + 1) * dim]) {
                *d += v;
            }
        }
        return out;
    }
    // Bucket the positions by target row with a stable counting sort: each row then adds its
    // contributions in increasing i, the serial order, and rows run in parallel without sharing.
    let mut row_starts = vec![0usize; vocab + 1];
    for &id in ids {
        row_starts[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        row_starts[v + 1] += row_starts[v];
    }
    let mut next = row_starts.clone();
    let mut order = vec![0usize; ids.len()];
    for (i, &id) in ids.iter().enumerate() {
        order[next[id as usize]] = i;
        next[id as usize] += 1;
    }
    out.par_chunks_mut(dim).enumerate().for_each(|(v, dst)| {
        for &i in &order[row_starts[v]..row_starts[v + 1]] {
            for (d, &value) in dst.iter_mut().zip(&g[i * dim..(i + 1) * dim]) {
                *d += value;
            }
        }
    });
    out
}

/// `out[r] = x[r, ids[r]]` over the rows `r` of `x [.., C]`'s last axis (PyTorch's `gather`
/// along the last axis, squeezed): how `cross_entropy` reads each row's label.
pub fn pick_last(x: &[f32], lx: &Layout, ids: &[i64]) -> KResult<Vec<f32>> {
    const K: &str = "pick";
    check::view(K, "x", x.len(), lx)?;
    let Some((&classes, rows)) = lx.shape.split_last() else {
        return Err(KernelError::Shapes {
            kernel: K,
            detail: "the values are a scalar; there is no axis to pick from".into(),
        });
    };
    check::shapes(K, numel(rows) == ids.len(), || {
        format!(
            "{} indices for {} rows of {:?}",
            ids.len(),
            numel(rows),
            &lx.shape[..]
        )
    })?;
    check::indices(K, ids, classes)?;
    let mut out = crate::pool::take(ids.len());
    let last_stride = lx.strides.last().copied().unwrap_or(0);
    for (r, (o, &id)) in out.iter_mut().zip(ids).enumerate() {
        let row = lx.offset + position(r * classes, &lx.shape, &lx.strides);
        *o = x[row + id as usize * last_stride];
    }
    Ok(out)
}

/// Backward of [`pick_last`]: zeros of `x_shape` with `g[r]` at `[r, ids[r]]`.
pub fn pick_last_grad(g: &[f32], lg: &Layout, ids: &[i64], x_shape: &[usize]) -> KResult<Vec<f32>> {
    const K: &str = "pick_grad";
    check::view(K, "g", g.len(), lg)?;
    let Some((&classes, rows)) = x_shape.split_last() else {
        return Err(KernelError::Shapes {
            kernel: K,
            detail: "the values are a scalar; there is no axis to pick from".into(),
        });
    };
    check::shapes(K, lg.shape[..] == *rows && ids.len() == numel(rows), || {
        format!(
            "gradient {:?} and {} indices for the rows of {x_shape:?}",
            &lg.shape[..],
            ids.len()
        )
    })?;
    check::indices(K, ids, classes)?;
    let mut out = crate::pool::take_zeroed(check::elements(K, x_shape)?);
    let g = contiguous_cow(g, lg);
    for (r, (&v, &id)) in g.iter().zip(ids).enumerate() {
        out[r * classes + id as usize] = v;
    }
    Ok(out)
}
