//! The work of one batch slice: query rows in groups of `ROWS`, so that each key and value
//! row read from L1 serves `ROWS` queries from registers (one row at a time, a slice's
//! products ran at about 28 GFLOP/s; the loads, not the arithmetic, were the limit).
//!
//! Every value is computed in the order the one-row-at-a-time kernel used: a score is its
//! dot product in order of the feature axis, a row's sums and maxima run in `LANES`
//! interleaved lanes, an output or gradient row adds its terms in order of the key (or the
//! query). A group of rows covers the keys its last row sees; the keys that an earlier row of
//! the group may not see get weight 0 (and their scores -inf), which adds nothing: the
//! results are the bits of row-by-row evaluation for finite inputs.

use super::{KEY_BLOCK, Rows, Scratch, Slice};
use crate::cpu::scalar::exp;

/// Query rows per register tile: `ROWS x KEY_BLOCK` scores are 8 AVX-512 (or 16 AVX2)
/// registers, a value block's `ROWS x LANES` partial outputs 4 (or 8).
const ROWS: usize = 4;

/// Independent accumulators of the sums and maxima over a row of scores (one chain each, so
/// the loops vectorize), and the columns of one register of partial output.
const LANES: usize = 16;

/// The sum of `xs` in `LANES` interleaved f32 accumulators, added pairwise at the end.
#[inline(always)]
fn lane_sum(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l += x;
        }
    }
    for (l, &x) in lanes.iter_mut().zip(tail) {
        *l += x;
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    lanes[0]
}

/// The dot product of `a` and `b` in the order of [`lane_sum`].
#[inline(always)]
fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    for ((l, &x), &y) in lanes.iter_mut().zip(ta).zip(tb) {
        *l += x * y;
    }
    lane_sum(&lanes)
}

/// The largest of `xs` (NaN ignored, as `f32::max` does; NEG_INFINITY when empty), in lanes.
#[inline(always)]
fn lane_max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            // A comparison, not `f32::max`, so it is one vector compare and select.
            *l = if x > *l { x } else { *l };
        }
    }
    for (l, &x) in lanes.iter_mut().zip(tail) {
        *l = if x > *l { x } else { *l };
    }
    lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// `rows` rounded up to whole key blocks: the row length of the transposed keys and values.
fn padded(rows: usize) -> usize {
    rows.div_ceil(KEY_BLOCK) * KEY_BLOCK
}

/// `m` (`rows x cols`, contiguous) transposed into `t` (`cols x stride`), zero in the columns
/// from `rows` on, so a block of keys is always `KEY_BLOCK` wide.
fn transpose_padded(m: &[f32], rows: usize, cols: usize, stride: usize, t: &mut Vec<f32>) {
    t.clear();
    t.resize(cols * stride, 0.0);
    for (j, row) in m.chunks_exact(cols).take(rows).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            t[c * stride + j] = x;
        }
    }
}

/// `out = m * scale`, elementwise.
fn scaled_into(m: &[f32], scale: f32, out: &mut Vec<f32>) {
    out.clear();
    out.extend(m.iter().map(|&x| x * scale));
}

/// `s[r][j] = sum over e of a[r][e] * bt[e][start + j]` for `R` rows of `a` (`R x d`,
/// contiguous) and one block of columns of `bt` (`d x stride`), each sum in order of `e`.
#[inline(always)]
fn block_products<const R: usize>(
    a: &[f32],
    d: usize,
    bt: &[f32],
    stride: usize,
    start: usize,
) -> [[f32; KEY_BLOCK]; R] {
    let mut s = [[0.0f32; KEY_BLOCK]; R];
    let a = &a[..R * d];
    for e in 0..d {
        let b = &bt[e * stride + start..e * stride + start + KEY_BLOCK];
        for (r, s) in s.iter_mut().enumerate() {
            let x = a[r * d + e];
            for (o, &y) in s.iter_mut().zip(b) {
                *o += x * y;
            }
        }
    }
    s
}

/// `acc[r][c..c + W] += sum over j < n of p[r][j] * v[j][c..c + W]`, in order of `j`, the
/// `R x W` partial sums held in registers.
#[inline(always)]
fn add_weighted_cols<const R: usize, const W: usize>(
    p: &[[f32; KEY_BLOCK]; R],
    n: usize,
    v: &[f32],
    dv: usize,
    c: usize,
    acc: &mut [f32],
) {
    let n = n.min(KEY_BLOCK);
    let mut a = [[0.0f32; W]; R];
    for (r, a) in a.iter_mut().enumerate() {
        a.copy_from_slice(&acc[r * dv + c..r * dv + c + W]);
    }
    for j in 0..n {
        let x = &v[j * dv + c..j * dv + c + W];
        for (a, p) in a.iter_mut().zip(p) {
            let w = p[j];
            for (o, &y) in a.iter_mut().zip(x) {
                *o += w * y;
            }
        }
    }
    for (r, a) in a.iter().enumerate() {
        acc[r * dv + c..r * dv + c + W].copy_from_slice(a);
    }
}

/// `acc[r] += sum over j < n of p[r][j] * v[j]` for every column of `v` (`n x dv`).
#[inline(always)]
fn add_weighted<const R: usize>(
    p: &[[f32; KEY_BLOCK]; R],
    n: usize,
    v: &[f32],
    dv: usize,
    acc: &mut [f32],
) {
    let full = dv / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        add_weighted_cols::<R, LANES>(p, n, v, dv, c, acc);
    }
    for c in full..dv {
        add_weighted_cols::<R, 1>(p, n, v, dv, c, acc);
    }
}

/// What the rows of one slice read, gathered contiguous by [`forward_slice`] or
/// [`backward_slice`].
struct SliceData<'a> {
    /// Queries scaled by 1/sqrt(D), `Tq x D`.
    qs: &'a [f32],
    /// Keys transposed and padded, `D x stride`.
    kt: &'a [f32],
    stride: usize,
    tk: usize,
    d: usize,
    causal: bool,
}

impl SliceData<'_> {
    /// Keys that query row `i` sees: `0..key_end(i)`.
    #[inline(always)]
    fn key_end(&self, i: usize) -> usize {
        if self.causal { i + 1 } else { self.tk }
    }
}

/// The output rows `first..first + R` (`Dv` each): for each block of keys, the group's
/// scores, each row's online-softmax update, and the weighted value rows added.
#[inline(always)]
fn forward_rows<const R: usize>(
    x: &SliceData<'_>,
    (v, dv): (&[f32], usize),
    first: usize,
    acc: &mut [f32],
    out: &mut [f32],
) {
    let acc = &mut acc[..R * dv];
    acc.fill(0.0);
    let mut max = [f32::NEG_INFINITY; R];
    let mut sum = [0.0f32; R];
    let end = x.key_end(first + R - 1);
    let qs = &x.qs[first * x.d..(first + R) * x.d];
    for start in (0..end).step_by(KEY_BLOCK) {
        let n = (end - start).min(KEY_BLOCK);
        let mut p = block_products::<R>(qs, x.d, x.kt, x.stride, start);
        for (r, row) in p.iter_mut().enumerate() {
            let seen = x.key_end(first + r).saturating_sub(start).min(KEY_BLOCK);
            row[seen..].fill(f32::NEG_INFINITY);
            let new_max = max[r].max(lane_max(row));
            if new_max == f32::NEG_INFINITY {
                // Nothing seen yet: no weight (exp(-inf - -inf) would be NaN).
                row.fill(0.0);
                continue;
            }
            // Rescale what the earlier blocks added up under the old maximum.
            if max[r] != f32::NEG_INFINITY && new_max > max[r] {
                let rescale = exp(max[r] - new_max);
                sum[r] *= rescale;
                acc[r * dv..(r + 1) * dv]
                    .iter_mut()
                    .for_each(|a| *a *= rescale);
            }
            for s in row.iter_mut() {
                *s = exp(*s - new_max);
            }
            sum[r] += lane_sum(row);
            max[r] = new_max;
        }
        add_weighted::<R>(&p, n, &v[start * dv..(start + n) * dv], dv, acc);
    }
    for (r, sum) in sum.iter().enumerate() {
        let inv = 1.0 / sum;
        let row = first + r;
        let o = &mut out[row * dv..(row + 1) * dv];
        for (o, &a) in o.iter_mut().zip(&acc[r * dv..(r + 1) * dv]) {
            *o = a * inv;
        }
    }
}

/// The output rows of one slice (`Tq x Dv`).
#[inline(always)]
pub(super) fn forward_slice(a: &Slice<'_, '_>, w: &mut Scratch, out: &mut [f32]) {
    let (q, k, v) = (a.q, a.k, a.v);
    let (tq, tk, d, dv) = (q.rows, k.rows, q.cols, v.cols);
    q.slice_into(a.s, &mut w.q);
    k.slice_into(a.s, &mut w.k);
    v.slice_into(a.s, &mut w.v);
    scaled_into(&w.q, a.scale, &mut w.qs);
    let stride = padded(tk);
    transpose_padded(&w.k, tk, d, stride, &mut w.kt);
    w.acc.resize(ROWS * dv, 0.0);
    let x = SliceData {
        qs: &w.qs,
        kt: &w.kt,
        stride,
        tk,
        d,
        causal: a.causal,
    };
    let mut first = 0;
    while first + ROWS <= tq {
        forward_rows::<ROWS>(&x, (&w.v, dv), first, &mut w.acc, out);
        first += ROWS;
    }
    while first < tq {
        forward_rows::<1>(&x, (&w.v, dv), first, &mut w.acc, out);
        first += 1;
    }
}

/// Rows of one slice's backward pass beyond [`SliceData`]: unscaled queries, keys, output
/// gradients (`T x D` each) and values transposed like the keys.
struct BackwardData<'a> {
    q: &'a [f32],
    k: &'a [f32],
    g: &'a [f32],
    vt: &'a [f32],
    scale: f32,
}

/// `dq[first + r][c..c + W] += sum over j < end of ds[r][j] * k[j][c..c + W]`, in order of
/// `j`; `ds` holds `R` rows of `stride` values.
#[inline(always)]
fn dq_cols<const R: usize, const W: usize>(
    (ds, stride): (&[f32], usize),
    (k, d): (&[f32], usize),
    (first, end, c): (usize, usize, usize),
    dq: &mut [f32],
) {
    let mut a = [[0.0f32; W]; R];
    for (r, a) in a.iter_mut().enumerate() {
        let at = (first + r) * d + c;
        a.copy_from_slice(&dq[at..at + W]);
    }
    for j in 0..end {
        let x = &k[j * d + c..j * d + c + W];
        for (r, a) in a.iter_mut().enumerate() {
            let s = ds[r * stride + j];
            for (o, &y) in a.iter_mut().zip(x) {
                *o += s * y;
            }
        }
    }
    for (r, a) in a.iter().enumerate() {
        let at = (first + r) * d + c;
        dq[at..at + W].copy_from_slice(a);
    }
}

/// `dk[j][c..c + W] += ds[r][j] * q[first + r][c..c + W]` and `dv[j][..] += p[r][j] *
/// g[first + r][..]` for `j < end`, the rows `r` added in order, the group's `R` query and
/// gradient chunks held in registers.
#[inline(always)]
fn dkv_cols<const R: usize, const W: usize>(
    (ds, p, stride): (&[f32], &[f32], usize),
    (q, g, d): (&[f32], &[f32], usize),
    (first, end, c): (usize, usize, usize),
    (dk, dv): (&mut [f32], &mut [f32]),
) {
    let mut qc = [[0.0f32; W]; R];
    let mut gc = [[0.0f32; W]; R];
    for r in 0..R {
        let at = (first + r) * d + c;
        qc[r].copy_from_slice(&q[at..at + W]);
        gc[r].copy_from_slice(&g[at..at + W]);
    }
    for j in 0..end {
        let at = j * d + c;
        let mut a = [0.0f32; W];
        a.copy_from_slice(&dk[at..at + W]);
        for (r, qc) in qc.iter().enumerate() {
            let s = ds[r * stride + j];
            for (o, &y) in a.iter_mut().zip(qc) {
                *o += s * y;
            }
        }
        dk[at..at + W].copy_from_slice(&a);
        a.copy_from_slice(&dv[at..at + W]);
        for (r, gc) in gc.iter().enumerate() {
            let s = p[r * stride + j];
            for (o, &y) in a.iter_mut().zip(gc) {
                *o += s * y;
            }
        }
        dv[at..at + W].copy_from_slice(&a);
    }
}

/// The gradient contributions of query rows `first..first + R`: their weights recomputed
/// (`p`), the weights' gradients (`ds`, in `dp`), then dq of these rows and their
/// contributions to dk and dv of every key they see.
#[inline(always)]
fn backward_rows<const R: usize>(
    x: &SliceData<'_>,
    y: &BackwardData<'_>,
    first: usize,
    (p, dp): (&mut [f32], &mut [f32]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (d, stride) = (x.d, x.stride);
    let end = x.key_end(first + R - 1);
    let width = padded(end);
    let qs = &x.qs[first * d..(first + R) * d];
    let g = &y.g[first * d..(first + R) * d];
    for start in (0..width).step_by(KEY_BLOCK) {
        let s = block_products::<R>(qs, d, x.kt, stride, start);
        let o = block_products::<R>(g, d, y.vt, stride, start);
        for r in 0..R {
            p[r * stride + start..r * stride + start + KEY_BLOCK].copy_from_slice(&s[r]);
            dp[r * stride + start..r * stride + start + KEY_BLOCK].copy_from_slice(&o[r]);
        }
    }
    for r in 0..R {
        let seen = x.key_end(first + r);
        let pr = &mut p[r * stride..r * stride + width];
        let dpr = &mut dp[r * stride..r * stride + width];
        // This row's weights, recomputed; the keys it does not see weigh 0.
        pr[seen..].fill(f32::NEG_INFINITY);
        let max = lane_max(pr);
        for s in pr.iter_mut() {
            *s = exp(*s - max);
        }
        let inv = 1.0 / lane_sum(pr);
        pr.iter_mut().for_each(|s| *s *= inv);
        // dP = g v^T, then dS = P * (dP - sum(P * dP)), scaled for q and k.
        let dot = lane_dot(pr, dpr);
        for (s, &pw) in dpr.iter_mut().zip(pr.iter()) {
            *s = pw * (*s - dot) * y.scale;
        }
        dpr[seen..].fill(0.0);
    }
    let full = d / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        dq_cols::<R, LANES>((dp, stride), (y.k, d), (first, end, c), dq);
        dkv_cols::<R, LANES>((dp, p, stride), (y.q, y.g, d), (first, end, c), (dk, dv));
    }
    for c in full..d {
        dq_cols::<R, 1>((dp, stride), (y.k, d), (first, end, c), dq);
        dkv_cols::<R, 1>((dp, p, stride), (y.q, y.g, d), (first, end, c), (dk, dv));
    }
}

/// The q, k and v gradient rows of one slice (q, k and v of one shape `T x D`).
#[inline(always)]
pub(super) fn backward_slice(
    a: &Slice<'_, '_>,
    w: &mut Scratch,
    g: &Rows<'_>,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (q, k, v) = (a.q, a.k, a.v);
    let (t, d) = (q.rows, q.cols);
    q.slice_into(a.s, &mut w.q);
    k.slice_into(a.s, &mut w.k);
    v.slice_into(a.s, &mut w.v);
    g.slice_into(a.s, &mut w.g);
    scaled_into(&w.q, a.scale, &mut w.qs);
    let stride = padded(t);
    transpose_padded(&w.k, t, d, stride, &mut w.kt);
    transpose_padded(&w.v, t, d, stride, &mut w.vt);
    w.p.resize(ROWS * stride, 0.0);
    w.dp.resize(ROWS * stride, 0.0);
    let x = SliceData {
        qs: &w.qs,
        kt: &w.kt,
        stride,
        tk: t,
        d,
        causal: a.causal,
    };
    let y = BackwardData {
        q: &w.q,
        k: &w.k,
        g: &w.g,
        vt: &w.vt,
        scale: a.scale,
    };
    let mut first = 0;
    while first + ROWS <= t {
        backward_rows::<ROWS>(&x, &y, first, (&mut w.p, &mut w.dp), (dq, dk, dv));
        first += ROWS;
    }
    while first < t {
        backward_rows::<1>(&x, &y, first, (&mut w.p, &mut w.dp), (dq, dk, dv));
        first += 1;
    }
}
