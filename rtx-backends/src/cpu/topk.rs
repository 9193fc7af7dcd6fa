//! The `k` largest values of each row (the last axis) and their positions, as `torch.topk`:
//! largest first, a NaN counting as the largest, ties kept in index order (so results are
//! the same on every run and every machine), and the gradient that sends each output's
//! gradient back to the position it came from.

use super::check::{self, KResult, KernelError};
use super::strided::contiguous_cow;
use crate::layout::Layout;
use std::borrow::Cow;
use std::cmp::Ordering;

/// Largest first; NaN before every number; equal values by position.
fn descending(row: &[f32], a: usize, b: usize) -> Ordering {
    let (x, y) = (row[a], row[b]);
    match (x.is_nan(), y.is_nan()) {
        (true, true) => a.cmp(&b),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => y.partial_cmp(&x).unwrap_or(Ordering::Equal).then(a.cmp(&b)),
    }
}

/// The rows of `x` (contiguous) and their length, checking `1 <= k <= n`.
fn rows<'a>(
    kernel: &'static str,
    x: &'a [f32],
    l: &Layout,
    k: usize,
) -> KResult<(Cow<'a, [f32]>, usize)> {
    check::view(kernel, "x", x.len(), l)?;
    check::elements(kernel, &l.shape)?;
    let Some(&n) = l.shape.last() else {
        return Err(KernelError::Shapes {
            kernel,
            detail: "x is a scalar; top-k needs a last axis".into(),
        });
    };
    if k == 0 || k > n {
        return Err(KernelError::Argument {
            kernel,
            detail: format!("k = {k} must be between 1 and the last axis' {n}"),
        });
    }
    Ok((contiguous_cow(x, l), n))
}

/// Positions of the `k` largest values of `row`, in output order.
fn top_positions(row: &[f32], k: usize, order: &mut Vec<usize>) {
    order.clear();
    order.extend(0..row.len());
    if k < row.len() {
        order.select_nth_unstable_by(k - 1, |&a, &b| descending(row, a, b));
        order.truncate(k);
    }
    order.sort_by(|&a, &b| descending(row, a, b));
}

/// The `k` largest values of each row of `x` and their positions, `[.., k]` each.
pub fn top_k(x: &[f32], l: &Layout, k: usize) -> KResult<(Vec<f32>, Vec<i64>)> {
    let (data, n) = rows("top_k", x, l, k)?;
    let count = data.len() / n;
    let (mut values, mut positions) =
        (Vec::with_capacity(count * k), Vec::with_capacity(count * k));
    let mut order = Vec::with_capacity(n);
    for row in data.chunks_exact(n) {
        top_positions(row, k, &mut order);
        values.extend(order.iter().map(|&j| row[j]));
        positions.extend(order.iter().map(|&j| j as i64));
    }
    Ok((values, positions))
}

/// Backward of the values of [`top_k`]: zeros shaped like `x`, with each row's `g[.., i]`
/// at the position its `i`-th largest value came from.
pub fn top_k_grad(x: &[f32], lx: &Layout, g: &[f32], lg: &Layout, k: usize) -> KResult<Vec<f32>> {
    const K: &str = "top_k_grad";
    let (data, n) = rows(K, x, lx, k)?;
    check::view(K, "g", g.len(), lg)?;
    let mut want = lx.shape.to_vec();
    if let Some(last) = want.last_mut() {
        *last = k;
    }
    check::shapes(K, lg.shape[..] == want[..], || {
        format!("g is {:?}, top-k of x gives {:?}", &lg.shape[..], want)
    })?;
    let g = contiguous_cow(g, lg);
    let mut out = crate::pool::take(data.len());
    out.fill(0.0);
    let mut order = Vec::with_capacity(n);
    for ((row, g_row), out_row) in data
        .chunks_exact(n)
        .zip(g.chunks_exact(k))
        .zip(out.chunks_exact_mut(n))
    {
        top_positions(row, k, &mut order);
        for (&j, &gv) in order.iter().zip(g_row) {
            out_row[j] = gv;
        }
    }
    Ok(out)
}
