//! Kernels that move rows and blocks: concat, the narrow gradient, embedding gather/scatter,
//! picking one element per row (labels) and its gradient.

use std::borrow::Cow;

use rayon::prelude::*;

use crate::layout::{Dims, Layout};

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

/// Concatenate at least one input along `axis` (shapes agree off the axis). Returns
/// (out, out_shape).
pub fn concat(inputs: &[(&[f32], &Layout)], axis: usize) -> KResult<(Vec<f32>, Dims)> {
    const K: &str = "concat";
    let Some((_, first)) = inputs.first() else {
        return Err(KernelError::Shapes {
            kernel: K,
            detail: "there is nothing to concatenate".into(),
        });
    };
    check::shapes(K, axis < first.rank(), || {
        format!(
            "axis {axis} is out of range for parts of rank {}",
            first.rank()
        )
    })?;
    let mut out_shape = first.shape.clone();
    out_shape[axis] = 0;
    for (k, &(data, l)) in inputs.iter().enumerate() {
        check::view(K, check::input_name(k), data.len(), l)?;
        let agree = l.rank() == first.rank()
            && (0..l.rank()).all(|i| i == axis || l.shape[i] == first.shape[i]);
        check::shapes(K, agree, || {
            format!(
                "part {k} has shape {:?}, which differs from part 0's {:?} off axis {axis}",
                &l.shape[..],
                &first.shape[..]
            )
        })?;
        out_shape[axis] =
            out_shape[axis]
                .checked_add(l.shape[axis])
                .ok_or_else(|| KernelError::Shapes {
                    kernel: K,
                    detail: format!("the parts' sizes along axis {axis} overflow"),
                })?;
    }
    check::elements(K, &out_shape)?;
    let inner = numel(&out_shape[axis + 1..]);
    // Seen as [outer, len, inner], each input contributes one run of len_i * inner per outer index.
    let parts: smallvec::SmallVec<[(Cow<[f32]>, usize); 4]> = inputs
        .iter()
        .map(|&(data, l)| (contiguous_cow(data, l), l.shape[axis] * inner))
        .collect();
    let mut out = crate::pool::take(numel(&out_shape));
    for_each_block(&mut out, out_shape[axis] * inner, |outer, block| {
        let mut at = 0;
        for (part, run) in &parts {
            block[at..at + run].copy_from_slice(&part[outer * run..(outer + 1) * run]);
            at += run;
        }
    });
    Ok((out, out_shape))
}

/// Backward of narrow: zeros of full shape (g's shape with axis size full_len) with g written at start..start+len on axis.
pub fn pad_narrow(
    g: &[f32],
    lg: &Layout,
    axis: usize,
    start: usize,
    full_len: usize,
) -> KResult<Vec<f32>> {
    const K: &str = "pad_narrow";
    check::view(K, "g", g.len(), lg)?;
    check::shapes(K, axis < lg.rank(), || {
        format!(
            "axis {axis} is out of range for a gradient of rank {}",
            lg.rank()
        )
    })?;
    let fits = start
        .checked_add(lg.shape[axis])
        .is_some_and(|end| end <= full_len);
    check::shapes(K, fits, || {
        format!(
            "{} values from {start} do not fit in {full_len} along axis {axis}",
            lg.shape[axis]
        )
    })?;
    let mut full_shape = lg.shape.clone();
    full_shape[axis] = full_len;
    check::elements(K, &full_shape)?;
    let inner = numel(&lg.shape[axis + 1..]);
    let run = lg.shape[axis] * inner;
    let outer = numel(&lg.shape[..axis]);
    let g = contiguous_cow(g, lg);
    let mut out = crate::pool::take_zeroed(outer * full_len * inner);
    for_each_block(&mut out, full_len * inner, |index, block| {
        block[start * inner..start * inner + run]
            .copy_from_slice(&g[index * run..(index + 1) * run]);
    });
    Ok(out)
}

/// Embedding lookup: table [V, D], ids any shape with 0 <= id < V -> ids.shape + [D]
pub fn gather_rows(table: &[f32], lt: &Layout, ids: &[i64]) -> KResult<Vec<f32>> {
    const K: &str = "gather_rows";
    check::view(K, "table", table.len(), lt)?;
    check::shapes(K, lt.rank() == 2, || {
        format!("the table has shape {:?}, not [V, D]", &lt.shape[..])
    })?;
    check::indices(K, ids, lt.shape[0])?;
    let dim = lt.shape[1];
    check::elements(K, &[ids.len(), dim])?;
    let [row_stride, col_stride] = [lt.strides[0], lt.strides[1]];
    let mut out = crate::pool::take(ids.len() * dim);
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
    Ok(out)
}

/// Backward: zeros [V, D], add g rows (g is ids.shape + [D], read in row-major order) into
/// rows ids[i]. Deterministic.
pub fn scatter_add_rows(g: &[f32], lg: &Layout, ids: &[i64], vocab: usize) -> KResult<Vec<f32>> {
    const K: &str = "scatter_add_rows";
    check::view(K, "g", g.len(), lg)?;
    let Some((&dim, rows)) = lg.shape.split_last() else {
        return Err(KernelError::Shapes {
            kernel: K,
            detail: "the gradient is a scalar, not ids.shape + [D]".into(),
        });
    };
    check::shapes(K, check::elements(K, rows)? == ids.len(), || {
        format!(
            "a gradient of shape {:?} for {} ids",
            &lg.shape[..],
            ids.len()
        )
    })?;
    check::indices(K, ids, vocab)?;
    check::elements(K, &[vocab, dim])?;
    check::elements(K, &lg.shape)?;
    let g = contiguous_cow(g, lg);
    let mut out = crate::pool::take_zeroed(vocab * dim);
    if dim == 0 {
        return Ok(out);
    }
    if ids.len() * dim <= PARALLEL_THRESHOLD {
        for (i, &id) in ids.iter().enumerate() {
            let dst = &mut out[id as usize * dim..(id as usize + 1) * dim];
            for (d, &v) in dst.iter_mut().zip(&g[i * dim..(i + 1) * dim]) {
                *d += v;
            }
        }
        return Ok(out);
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
    Ok(out)
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
