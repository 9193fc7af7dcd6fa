//! Axis reductions (sum, mean, max), the max-reduction gradient, and `sum_to`.

use rayon::prelude::*;

use crate::layout::{Dims, Layout};

use super::check::{self, KResult};
use super::strided::{
    CHUNK, PARALLEL_THRESHOLD, Walk, contiguous, contiguous_cow, numel, position, with_f64_scratch,
};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
}

/// A group longer than this is reduced in pieces of this size, computed in parallel and combined
/// in piece order. Fixed, so the summation order depends on the shape only.
const GROUP_PIECE: usize = 16 * 1024;

/// Winners of `max_grad`, kept between calls (shared by all threads, like the f64 scratch)
/// so a training step after the first allocates nothing here.
static WINNERS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// `l` seen as kept axes times reduced axes: one group of elements per output element.
struct Groups {
    /// The kept axes: row-major index `i` of this layout is where output `i`'s group starts.
    kept: Layout,
    /// The reduced axes, offset 0: add a base to get buffer positions.
    group: Layout,
}

impl Groups {
    fn new(l: &Layout, axes: &[usize]) -> Self {
        let mut kept = Layout {
            shape: smallvec::smallvec![],
            strides: smallvec::smallvec![],
            offset: l.offset,
        };
        let mut group = Layout {
            shape: smallvec::smallvec![],
            strides: smallvec::smallvec![],
            offset: 0,
        };
        for axis in 0..l.rank() {
            let target = if axes.contains(&axis) {
                &mut group
            } else {
                &mut kept
            };
            target.shape.push(l.shape[axis]);
            target.strides.push(l.strides[axis]);
        }
        Groups { kept, group }
    }

    /// Number of groups (output elements).
    fn count(&self) -> usize {
        self.kept.numel()
    }

    /// Buffer position of the first element of group `out_index`.
    fn base(&self, out_index: usize) -> usize {
        self.kept.offset + position(out_index, &self.kept.shape, &self.kept.strides)
    }

    fn group_len(&self) -> usize {
        self.group.numel()
    }
}

/// Replaces `acc` by `v` when `v` is larger or is the first NaN, so NaN propagates and ties keep
/// the earliest value.
fn beats(v: f32, acc: f32) -> bool {
    v > acc || (v.is_nan() && !acc.is_nan())
}

/// Reduce over `axes` (distinct, < rank, in any order). keepdim keeps them as size 1.
/// Returns (out, out_shape).
pub fn reduce(
    op: ReduceOp,
    x: &[f32],
    l: &Layout,
    axes: &[usize],
    keepdim: bool,
) -> KResult<(Vec<f32>, Dims)> {
    const K: &str = "reduce";
    check::view(K, "x", x.len(), l)?;
    check::axes(K, axes, l.rank())?;
    check::elements(K, &l.shape)?;
    Ok(reduce_unchecked(op, x, l, axes, keepdim))
}

/// [`reduce`] on arguments the caller checked.
pub(crate) fn reduce_unchecked(
    op: ReduceOp,
    x: &[f32],
    l: &Layout,
    axes: &[usize],
    keepdim: bool,
) -> (Vec<f32>, Dims) {
    let out_shape: Dims = (0..l.rank())
        .filter_map(|axis| match (axes.contains(&axis), keepdim) {
            (false, _) => Some(l.shape[axis]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    if let Some(out) = reduce_leading_sum(op, x, l, axes) {
        return (out, out_shape);
    }
    if let Some(out) = reduce_around_sum(op, x, l, axes) {
        return (out, out_shape);
    }
    if let Some(out) = reduce_rows_sum(op, x, l, axes) {
        return (out, out_shape);
    }
    let trailing = is_trailing(axes, l.rank());
    let groups = Groups::new(l, axes);
    let group_len = groups.group_len();
    let walk = Walk::new(&groups.group.shape, [&groups.group]);
    let pieces = group_len.div_ceil(GROUP_PIECE).max(1);

    let partial = |index: usize| -> f64 {
        let (out_index, piece) = (index / pieces, index % pieces);
        let start = piece * GROUP_PIECE;
        let len = GROUP_PIECE.min(group_len.saturating_sub(start));
        let base = groups.base(out_index);
        match op {
            ReduceOp::Sum | ReduceOp::Mean if trailing => {
                // The order of `row_sum`, which the compiled row kernels use.
                let mut lanes = [0.0f64; SUM_LANES];
                walk.runs(start, len, |at, run, [pos], [stride]| {
                    for i in 0..run {
                        lanes[(at + i) % SUM_LANES] += x[base + pos + i * stride] as f64;
                    }
                });
                add_lanes(lanes)
            }
            ReduceOp::Sum | ReduceOp::Mean => {
                let mut acc = 0.0f64;
                walk.runs(start, len, |_, run, [pos], [stride]| {
                    for i in 0..run {
                        acc += x[base + pos + i * stride] as f64;
                    }
                });
                acc
            }
            ReduceOp::Max => {
                let mut acc = f32::NEG_INFINITY;
                walk.runs(start, len, |_, run, [pos], [stride]| {
                    for i in 0..run {
                        let v = x[base + pos + i * stride];
                        if beats(v, acc) {
                            acc = v;
                        }
                    }
                });
                acc as f64
            }
        }
    };
    let finish = |parts: &[f64]| match op {
        ReduceOp::Sum => parts.iter().sum::<f64>() as f32,
        ReduceOp::Mean => (parts.iter().sum::<f64>() / group_len as f64) as f32,
        ReduceOp::Max => parts
            .iter()
            .map(|&p| p as f32)
            .fold(
                f32::NEG_INFINITY,
                |acc, v| if beats(v, acc) { v } else { acc },
            ),
    };
    let parallel = groups.count() * group_len > PARALLEL_THRESHOLD;
    let mut out = crate::pool::take(groups.count());
    if pieces == 1 {
        let fill = |(index, o): (usize, &mut f32)| *o = finish(&[partial(index)]);
        if parallel {
            out.par_iter_mut().enumerate().for_each(fill);
        } else {
            out.iter_mut().enumerate().for_each(fill);
        }
    } else {
        with_f64_scratch(|partials| {
            (0..groups.count() * pieces)
                .into_par_iter()
                .map(partial)
                .collect_into_vec(partials);
            for (o, parts) in out.iter_mut().zip(partials.chunks(pieces)) {
                *o = finish(parts);
            }
        });
    }
    (out, out_shape)
}

/// Sum or mean over the leading axes of a contiguous tensor (a bias gradient: `[B, N] -> [N]`),
/// row by row into f64 accumulators, which vectorizes across the kept elements. Each output
/// still sums its terms in row order, as the general path does, so the bits are the same.
/// `None` when the reduction is not of that form, or is too short to need it.
fn reduce_leading_sum(op: ReduceOp, x: &[f32], l: &Layout, axes: &[usize]) -> Option<Vec<f32>> {
    let leading = axes.iter().enumerate().all(|(i, &axis)| i == axis);
    if op == ReduceOp::Max || axes.is_empty() || !leading || !l.is_contiguous() {
        return None;
    }
    let rows = numel(&l.shape[..axes.len()]);
    let inner = numel(&l.shape[axes.len()..]);
    // Long columns would go to the general path's parallel pieces; narrow rows gain nothing.
    if rows > GROUP_PIECE || inner < 8 || rows * inner > 4 * PARALLEL_THRESHOLD * 16 {
        return None;
    }
    let data = &x[l.offset..l.offset + rows * inner];
    let mut out = crate::pool::take(inner);
    with_f64_scratch(|acc| {
        acc.clear();
        acc.resize(inner, 0.0);
        for row in data.chunks_exact(inner) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v as f64;
            }
        }
        let scale = if op == ReduceOp::Mean {
            rows as f64
        } else {
            1.0
        };
        for (o, &a) in out.iter_mut().zip(acc.iter()) {
            *o = if op == ReduceOp::Mean {
                (a / scale) as f32
            } else {
                a as f32
            };
        }
    });
    Some(out)
}

/// Interleaved accumulators of a sum over trailing axes (see [`row_sum`]).
const SUM_LANES: usize = 8;

/// Whether `axes` are the last `axes.len()` axes of a rank-`rank` tensor (in any order).
fn is_trailing(axes: &[usize], rank: usize) -> bool {
    !axes.is_empty() && axes.iter().all(|&a| a + axes.len() >= rank && a < rank)
}

/// The lanes of one piece added pairwise, in a fixed tree.
#[inline(always)]
fn add_lanes(a: [f64; SUM_LANES]) -> f64 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// One piece (at most `GROUP_PIECE` values) summed in f64 with value `i` in accumulator
/// `i % 8`: eight independent chains, which the compiler vectorizes.
#[inline(always)]
fn lane_sum(values: &[f32]) -> f64 {
    let mut lanes = [0.0f64; SUM_LANES];
    let chunks = values.chunks_exact(SUM_LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v as f64;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(tail) {
        *lane += v as f64;
    }
    add_lanes(lanes)
}

/// The f64 sum of a row of values, in the order every reduction over trailing axes uses (the
/// compiled row kernels, `reduce` and `sum_to` over the last axes): pieces of `GROUP_PIECE`
/// values, each summed in eight interleaved f64 accumulators added pairwise, the pieces'
/// sums added in order. One order everywhere keeps a fused row kernel bit-identical to the
/// unfused kernels; interleaving keeps the sum off one long dependency chain.
#[inline(always)]
pub fn row_sum(values: &[f32]) -> f64 {
    if values.is_empty() {
        return std::iter::once(0.0f64).sum();
    }
    values.chunks(GROUP_PIECE).map(lane_sum).sum()
}

/// The largest of a row of values, NaN first and ties to the earliest (the rule of `reduce`).
#[inline(always)]
pub fn row_max(values: &[f32]) -> f32 {
    values.iter().fold(
        f32::NEG_INFINITY,
        |acc, &v| if beats(v, acc) { v } else { acc },
    )
}

/// Sum or mean over the trailing axes of a contiguous tensor: each group is one contiguous
/// row, summed by [`row_sum`] (the general path's order for these axes, vectorized). `None`
/// when the reduction is not of that form.
fn reduce_rows_sum(op: ReduceOp, x: &[f32], l: &Layout, axes: &[usize]) -> Option<Vec<f32>> {
    if op == ReduceOp::Max || !is_trailing(axes, l.rank()) || !l.is_contiguous() {
        return None;
    }
    let cols = numel(&l.shape[l.rank() - axes.len()..]);
    let rows = numel(&l.shape[..l.rank() - axes.len()]);
    if cols == 0 {
        return None;
    }
    let data = &x[l.offset..l.offset + rows * cols];
    let mut out = crate::pool::take(rows);
    let finish = |row: &[f32]| match op {
        ReduceOp::Mean => (row_sum(row) / cols as f64) as f32,
        _ => row_sum(row) as f32,
    };
    if rows * cols > PARALLEL_THRESHOLD && rows > 1 {
        let per_task = (CHUNK / cols).max(1);
        out.par_chunks_mut(per_task)
            .zip(data.par_chunks(per_task * cols))
            .for_each(|(o, d)| {
                for (o, row) in o.iter_mut().zip(d.chunks_exact(cols)) {
                    *o = finish(row);
                }
            });
    } else {
        for (o, row) in out.iter_mut().zip(data.chunks_exact(cols)) {
            *o = finish(row);
        }
    }
    Some(out)
}

/// Sum or mean of a contiguous tensor over every axis but one block in the middle (a
/// convolution's bias gradient: `[N, O, H, W] -> [O]`), seen as `[outer, kept, inner]`: each
/// output adds its `inner`-long runs in row order into one f64, the general path's order, so
/// the bits are the same, without walking the runs axis by axis. `None` when the reduction is
/// not of that form.
fn reduce_around_sum(op: ReduceOp, x: &[f32], l: &Layout, axes: &[usize]) -> Option<Vec<f32>> {
    let rank = l.rank();
    let first_kept = (0..rank).find(|a| !axes.contains(a))?;
    let end_kept = (first_kept..rank)
        .find(|a| axes.contains(a))
        .unwrap_or(rank);
    let around = (0..rank).all(|a| axes.contains(&a) == (a < first_kept || a >= end_kept));
    // A reduction over trailing axes (`first_kept == 0`) sums in `row_sum`'s order instead.
    if op == ReduceOp::Max || !around || end_kept == rank || first_kept == 0 || !l.is_contiguous() {
        return None;
    }
    let outer = numel(&l.shape[..first_kept]);
    let kept = numel(&l.shape[first_kept..end_kept]);
    let inner = numel(&l.shape[end_kept..]);
    let group_len = outer * inner;
    // Long groups go to the general path's parallel pieces.
    if group_len > GROUP_PIECE || kept * group_len > 4 * PARALLEL_THRESHOLD * 16 {
        return None;
    }
    let data = &x[l.offset..l.offset + outer * kept * inner];
    let mut out = crate::pool::take(kept);
    with_f64_scratch(|acc| {
        acc.clear();
        acc.resize(kept, 0.0);
        for block in data.chunks_exact(kept * inner) {
            for (a, run) in acc.iter_mut().zip(block.chunks_exact(inner)) {
                let mut sum = *a;
                for &v in run {
                    sum += v as f64;
                }
                *a = sum;
            }
        }
        for (o, &a) in out.iter_mut().zip(acc.iter()) {
            *o = match op {
                ReduceOp::Mean => (a / group_len as f64) as f32,
                _ => a as f32,
            };
        }
    });
    Some(out)
}

/// Gradient of Max-reduction: for each reduced group, the upstream gradient goes to the FIRST position (row-major order within the group) holding the max, zero elsewhere. g has the reduced shape (keepdim or not, as given). Output has x's shape.
pub fn max_grad(
    x: &[f32],
    lx: &Layout,
    g: &[f32],
    lg: &Layout,
    axes: &[usize],
    keepdim: bool,
) -> KResult<Vec<f32>> {
    const K: &str = "max_grad";
    check::view(K, "x", x.len(), lx)?;
    check::view(K, "g", g.len(), lg)?;
    check::axes(K, axes, lx.rank())?;
    check::shapes(
        K,
        is_reduced_shape(&lx.shape, axes, keepdim, &lg.shape),
        || {
            format!(
                "the gradient's shape {:?} is not {:?} reduced over axes {axes:?} (keepdim {keepdim})",
                &lg.shape[..],
                &lx.shape[..]
            )
        },
    )?;
    check::elements(K, &lx.shape)?;
    let source = Groups::new(lx, axes);
    let target = Groups::new(&Layout::contiguous(&lx.shape), axes);
    let group_len = source.group_len();
    let walk = Walk::new(&source.group.shape, [&source.group]);

    let g_kept = if keepdim {
        let mut kept = Layout {
            shape: smallvec::smallvec![],
            strides: smallvec::smallvec![],
            offset: lg.offset,
        };
        for axis in (0..lg.rank()).filter(|axis| !axes.contains(axis)) {
            kept.shape.push(lg.shape[axis]);
            kept.strides.push(lg.strides[axis]);
        }
        kept
    } else {
        lg.clone()
    };
    let g_values = contiguous_cow(g, &g_kept);

    let first_max = |out_index: usize| -> usize {
        let base = source.base(out_index);
        let mut best: Option<(usize, f32)> = None;
        walk.runs(0, group_len, |at, run, [pos], [stride]| {
            for i in 0..run {
                let v = x[base + pos + i * stride];
                if best.is_none_or(|(_, acc)| beats(v, acc)) {
                    best = Some((at + i, v));
                }
            }
        });
        best.map_or(NO_WINNER, |(index, _)| index)
    };
    let mut out = crate::pool::take_zeroed(numel(&lx.shape));
    // One write per group, so the scatter stays serial.
    let mut scatter = |out_index: usize, winner: usize| {
        if winner != NO_WINNER {
            let at = target.base(out_index)
                + position(winner, &target.group.shape, &target.group.strides);
            out[at] = g_values[out_index];
        }
    };
    if numel(&lx.shape) > PARALLEL_THRESHOLD {
        let mut winners = WINNERS
            .lock()
            .map(|mut kept| std::mem::take(&mut *kept))
            .unwrap_or_default();
        (0..source.count())
            .into_par_iter()
            .map(first_max)
            .collect_into_vec(&mut winners);
        for (out_index, &winner) in winners.iter().enumerate() {
            scatter(out_index, winner);
        }
        if let Ok(mut kept) = WINNERS.lock() {
            *kept = winners;
        }
    } else {
        for out_index in 0..source.count() {
            scatter(out_index, first_max(out_index));
        }
    }
    Ok(out)
}

/// Whether `reduced` is `shape` reduced over `axes` (kept as size 1 when `keepdim`).
fn is_reduced_shape(shape: &[usize], axes: &[usize], keepdim: bool, reduced: &[usize]) -> bool {
    let mut kept = reduced.iter();
    for (axis, &size) in shape.iter().enumerate() {
        let want = match (axes.contains(&axis), keepdim) {
            (false, _) => size,
            (true, true) => 1,
            (true, false) => continue,
        };
        if kept.next() != Some(&want) {
            return false;
        }
    }
    kept.next().is_none()
}

/// `max_grad`'s mark for a group with no element (empty groups receive no gradient).
const NO_WINNER: usize = usize::MAX;

/// Sum `g` down to `shape` (the inverse of NumPy broadcasting: sum leading extra axes and axes where shape has 1).
pub fn sum_to(g: &[f32], lg: &Layout, shape: &[usize]) -> KResult<Vec<f32>> {
    const K: &str = "sum_to";
    check::view(K, "g", g.len(), lg)?;
    let broadcasts = lg.rank() >= shape.len()
        && shape
            .iter()
            .zip(&lg.shape[lg.rank() - shape.len()..])
            .all(|(&to, &from)| to == from || to == 1);
    check::shapes(K, broadcasts, || {
        format!(
            "{shape:?} does not broadcast to the gradient's shape {:?}",
            &lg.shape[..]
        )
    })?;
    check::elements(K, &lg.shape)?;
    let extra = lg.rank() - shape.len();
    let axes: Dims = (0..lg.rank())
        .filter(|&axis| axis < extra || (shape[axis - extra] == 1 && lg.shape[axis] != 1))
        .collect();
    if axes.is_empty() {
        return Ok(contiguous(g, lg));
    }
    // The kept axes are `shape`'s axes minus some of size 1, so the row-major order matches.
    Ok(reduce_unchecked(ReduceOp::Sum, g, lg, &axes, false).0)
}

/// The index of the largest value along `axis` of `x` (read through `l`), for every position
/// of the other axes, in row-major order of the result (x's shape without `axis`): the first
/// on ties, a NaN counting as the largest (PyTorch's `argmax`).
pub fn argmax(x: &[f32], l: &Layout, axis: usize) -> KResult<Vec<i64>> {
    const K: &str = "argmax";
    check::view(K, "x", x.len(), l)?;
    check::axes(K, &[axis], l.rank())?;
    check::elements(K, &l.shape)?;
    let n = l.shape[axis];
    let outer: usize = l.shape[..axis].iter().product();
    let inner: usize = l.shape[axis + 1..].iter().product();
    let (s_axis, mut ids) = (l.strides[axis], Vec::with_capacity(outer * inner));
    // Offsets of the groups' first elements, in row-major order of the other axes.
    let mut rest = l.clone();
    rest.shape[axis] = 1;
    for start in rest.indices() {
        let mut best = 0;
        for j in 1..n {
            let (v, b) = (x[start + j * s_axis], x[start + best * s_axis]);
            if !b.is_nan() && (v.is_nan() || v > b) {
                best = j;
            }
        }
        ids.push(best as i64);
    }
    debug_assert_eq!(ids.len(), outer * inner);
    Ok(ids)
}
