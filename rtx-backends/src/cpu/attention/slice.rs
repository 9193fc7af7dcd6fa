//! The work of one batch slice: query rows in groups of `ROWS`, so that each key and value
//! row read from L1 serves `ROWS` queries from registers (one row at a time, a slice's
//! products ran at about 28 GFLOP/s; the loads, not the arithmetic, were the limit).
//!
//! Every sum runs in a fixed order: a score is its dot product in order of the feature axis,
//! a row's sums and maxima run in `LANES` interleaved lanes, an output row adds each key
//! block's terms in order of the key and then the block's sum, a key's gradient row adds
//! each query group's terms. A group of rows covers the keys its last row sees; the keys
//! that an earlier row of the group may not see get weight 0 (their scores -inf), which
//! adds nothing.

use super::{KEY_BLOCK, Rows, Scratch, Slice};
use crate::cpu::scalar::exp_fused as exp;

/// Query rows per register tile where key blocks are half wide (AVX2 and narrower):
/// `ROWS x KEY_BLOCK / 2` scores are 8 AVX2 registers, a value block's `ROWS x LANES`
/// partial outputs 8.
pub(super) const ROWS: usize = 4;

/// Query rows per register tile with whole key blocks (AVX-512): `WIDE_ROWS x KEY_BLOCK`
/// scores are 16 of the 32 registers, so each key row loaded serves twice the queries that
/// `ROWS` would (the forward pass ran at about 55 GFLOP/s with 4, load-bound).
pub(super) const WIDE_ROWS: usize = 8;

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
            *l = x.mul_add(y, *l);
        }
    }
    for ((l, &x), &y) in lanes.iter_mut().zip(ta).zip(tb) {
        *l = x.mul_add(y, *l);
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

/// `scale * m` transposed into `t` (`cols x stride`), where `m` holds `rows` rows of `cols`
/// values `rs` apart, with zeros in the columns from `rows` on, so a block of keys is always
/// `KEY_BLOCK` wide. Scaling the keys here, not the queries, lets q be read in place.
#[inline(always)]
fn transpose_padded(
    m: (&[f32], usize),
    (rows, cols): (usize, usize),
    scale: f32,
    stride: usize,
    t: &mut Vec<f32>,
) {
    t.resize(cols * stride, 0.0);
    if crate::cpu::gemm::transpose_scaled(m, (rows, cols), scale, (t, stride)) {
        for col in t.chunks_exact_mut(stride) {
            col[rows..].fill(0.0);
        }
        return;
    }
    for (c, col) in t.chunks_exact_mut(stride).enumerate() {
        for (j, o) in col[..rows].iter_mut().enumerate() {
            *o = m.0[j * m.1 + c] * scale;
        }
        col[rows..].fill(0.0);
    }
}

/// One register tile of a small product, for `i < R` and `l < W`:
/// `out[i][l] = sum over e < len of a[i * ai + e * ae] * b[e * bs + col + l]`, in order of
/// `e`. Every product of the kernels is this one loop nest (`a` read with any two strides, so
/// transposed too):
/// written once in the shape the compiler keeps in vector registers (`R x W` sums starting
/// from zero, `W` along the vector), where variants that loaded the sums from memory or
/// zipped the rows came out scalar or as gathers.
#[inline(always)]
fn tile<const R: usize, const W: usize>(
    (a, ai, ae): (&[f32], usize, usize),
    len: usize,
    (b, bs, col): (&[f32], usize, usize),
) -> [[f32; W]; R] {
    let mut s = [[0.0f32; W]; R];
    for e in 0..len {
        let b = &b[e * bs + col..e * bs + col + W];
        for (i, s) in s.iter_mut().enumerate() {
            let x = a[i * ai + e * ae];
            for (o, &y) in s.iter_mut().zip(b) {
                *o = x.mul_add(y, *o);
            }
        }
    }
    s
}

/// `s[r][j] = sum over e of a[r][e] * bt[e][start + j]` for `R` rows of `a` (`d` values
/// each, `ar` apart) and one block of columns of `bt` (`d x stride`), each sum in order of `e`, in
/// register tiles `KW` columns wide (`R x KW` sums must fit the vector registers with room for
/// the operands: 16 columns for AVX2's sixteen 256-bit registers, 32 for AVX-512's).
#[inline(always)]
fn block_products<const R: usize, const KW: usize>(
    (a, ar): (&[f32], usize),
    d: usize,
    bt: &[f32],
    stride: usize,
    start: usize,
) -> [[f32; KEY_BLOCK]; R] {
    let mut s = [[0.0f32; KEY_BLOCK]; R];
    for c in (0..KEY_BLOCK).step_by(KW) {
        let t = tile::<R, KW>((a, ar, 1), d, (bt, stride, start + c));
        for (row, t) in s.iter_mut().zip(&t) {
            row[c..c + KW].copy_from_slice(t);
        }
    }
    s
}

/// `acc[r][c..c + W] += sum over j < n of p[r][j] * v[j][c..c + W]`: the block's sum in
/// order of `j`, then added.
#[inline(always)]
fn add_weighted_cols<const R: usize, const W: usize>(
    p: &[[f32; KEY_BLOCK]; R],
    n: usize,
    (v, vr): (&[f32], usize),
    dv: usize,
    c: usize,
    acc: &mut [f32],
) {
    let p = p.as_flattened();
    let a = tile::<R, W>((p, KEY_BLOCK, 1), n.min(KEY_BLOCK), (v, vr, c));
    for (r, a) in a.iter().enumerate() {
        add_into(&mut acc[r * dv + c..r * dv + c + W], a);
    }
}

/// `dst += src`, elementwise.
#[inline(always)]
fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// `acc[r] += sum over j < n of p[r][j] * v[j]` for every column of `v` (`n` rows of `dv`
/// values, `vr` apart).
#[inline(always)]
fn add_weighted<const R: usize>(
    p: &[[f32; KEY_BLOCK]; R],
    n: usize,
    v: (&[f32], usize),
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

/// What the rows of one slice read ([`forward_slice`] or [`backward_slice`]).
struct SliceData<'a> {
    /// Queries, `Tq` rows of `D` values `qr` apart (in place forward, copied backward).
    q: &'a [f32],
    qr: usize,
    /// Keys scaled by 1/sqrt(D), transposed and padded, `D x stride`.
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
fn forward_rows<const R: usize, const KW: usize>(
    x: &SliceData<'_>,
    (v, vr, dv): (&[f32], usize, usize),
    first: usize,
    acc: &mut [f32],
    out: &mut [f32],
) {
    let acc = &mut acc[..R * dv];
    acc.fill(0.0);
    let mut max = [f32::NEG_INFINITY; R];
    let mut sum = [0.0f32; R];
    let end = x.key_end(first + R - 1);
    let q = (&x.q[first * x.qr..], x.qr);
    for start in (0..end).step_by(KEY_BLOCK) {
        let n = (end - start).min(KEY_BLOCK);
        let mut p = block_products::<R, KW>(q, x.d, x.kt, x.stride, start);
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
        add_weighted::<R>(&p, n, (&v[start * vr..], vr), dv, acc);
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
pub(super) fn forward_slice<const R: usize, const KW: usize>(
    a: &Slice<'_, '_>,
    w: &mut Scratch,
    out: &mut [f32],
) {
    let (q, k, v) = (a.q, a.k, a.v);
    let (tq, tk, d, dv) = (q.rows, k.rows, q.cols, v.cols);
    let ((qd, qr), (vd, vr)) = (q.slice(a.s), v.slice(a.s));
    let stride = padded(tk);
    transpose_padded(k.slice(a.s), (tk, d), a.scale, stride, &mut w.kt);
    w.acc.resize(R * dv, 0.0);
    let x = SliceData {
        q: qd,
        qr,
        kt: &w.kt,
        stride,
        tk,
        d,
        causal: a.causal,
    };
    let mut first = 0;
    while first + R <= tq {
        forward_rows::<R, KW>(&x, (vd, vr, dv), first, &mut w.acc, out);
        first += R;
    }
    while first < tq {
        forward_rows::<1, KW>(&x, (vd, vr, dv), first, &mut w.acc, out);
        first += 1;
    }
}

/// Rows of one slice's backward pass beyond [`SliceData`]: keys and output gradients (`T`
/// rows of `D` values, `kr` and `gr` apart; copied contiguous by [`backward_slice`]) and
/// values transposed like the keys (unscaled).
struct BackwardData<'a> {
    k: &'a [f32],
    kr: usize,
    g: &'a [f32],
    gr: usize,
    vt: &'a [f32],
    scale: f32,
}

/// `dq[first + r][c..c + W] = sum over j < end of ds[r][j] * k[j][c..c + W]`, in order of
/// `j` (each query row's gradient comes from its own group alone); `ds` holds `R` rows of
/// `stride` values, `k` rows `kr` apart, `dq` rows `d` apart.
#[inline(always)]
fn dq_cols<const R: usize, const W: usize>(
    (ds, stride): (&[f32], usize),
    (k, kr): (&[f32], usize),
    (first, end, c): (usize, usize, usize),
    (dq, d): (&mut [f32], usize),
) {
    let a = tile::<R, W>((ds, stride, 1), end, (k, kr, c));
    for (r, a) in a.iter().enumerate() {
        let at = (first + r) * d + c;
        dq[at..at + W].copy_from_slice(a);
    }
}

/// Keys per tile of the key and value gradients.
const KEYS: usize = 4;

/// Query rows whose weights are kept at once in the backward pass (`QUERY_CHUNK x T` values
/// each for the weights and their gradients): the key and value gradients then sum over this
/// many rows in registers before adding to memory.
const QUERY_CHUNK: usize = 64;

/// Rows of an operand and the distance between their starts.
type Strided<'a> = (&'a [f32], usize);

/// `dk[j][c..c + W] += sum over the chunk's rows i of ds[i][j] * q[i][c..c + W]` and
/// `dv[j][..] += sum over i of p[i][j] * g[i][..]` for `j < end`, in order of `i`, then
/// added; `KEYS` keys per tile (then one at a time). With `causal`, rows before key `j`
/// weigh it 0 and are skipped.
#[inline(always)]
fn dkv_cols<const W: usize>(
    x: &SliceData<'_>,
    (ds, p, stride): (&[f32], &[f32], usize),
    ((q, qr), (g, gr), d): (Strided<'_>, Strided<'_>, usize),
    (first, rows, end, c): (usize, usize, usize, usize),
    (dk, dv): (&mut [f32], &mut [f32]),
) {
    // The chunk's row that first sees key `j`, counted from the chunk's first row.
    let skip = |j: usize| if x.causal { j.saturating_sub(first) } else { 0 };
    let mut j = 0;
    while j < end {
        let e0 = skip(j);
        let keys = if j + KEYS <= end { KEYS } else { 1 };
        if e0 < rows {
            let len = rows - e0;
            let (q, g) = (&q[(first + e0) * qr..], &g[(first + e0) * gr..]);
            let (ds, p) = (&ds[e0 * stride + j..], &p[e0 * stride + j..]);
            if keys == KEYS {
                let tk = tile::<KEYS, W>((ds, 1, stride), len, (q, qr, c));
                let tv = tile::<KEYS, W>((p, 1, stride), len, (g, gr, c));
                for (i, (tk, tv)) in tk.iter().zip(&tv).enumerate() {
                    let at = (j + i) * d + c;
                    add_into(&mut dk[at..at + W], tk);
                    add_into(&mut dv[at..at + W], tv);
                }
            } else {
                let [tk] = tile::<1, W>((ds, 1, stride), len, (q, qr, c));
                let [tv] = tile::<1, W>((p, 1, stride), len, (g, gr, c));
                let at = j * d + c;
                add_into(&mut dk[at..at + W], &tk);
                add_into(&mut dv[at..at + W], &tv);
            }
        }
        j += keys;
    }
}

/// The weights of query rows `first..first + R` recomputed into rows `at..at + R` of `p`,
/// their gradients `ds` into `dp` (both zero from each row's last key to `width`), and
/// these rows' dq.
#[inline(always)]
fn backward_rows<const R: usize, const KW: usize>(
    x: &SliceData<'_>,
    y: &BackwardData<'_>,
    (first, at, width): (usize, usize, usize),
    (p, dp): (&mut [f32], &mut [f32]),
    dq: &mut [f32],
) {
    let (d, stride) = (x.d, x.stride);
    let end = x.key_end(first + R - 1);
    let own = padded(end);
    let q = (&x.q[first * x.qr..], x.qr);
    let g = (&y.g[first * y.gr..], y.gr);
    let (p, dp) = (&mut p[at * stride..], &mut dp[at * stride..]);
    for start in (0..own).step_by(KEY_BLOCK) {
        let s = block_products::<R, KW>(q, d, x.kt, stride, start);
        let o = block_products::<R, KW>(g, d, y.vt, stride, start);
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
        pr[seen..own].fill(f32::NEG_INFINITY);
        let max = lane_max(&pr[..own]);
        for s in pr[..own].iter_mut() {
            *s = exp(*s - max);
        }
        let inv = 1.0 / lane_sum(&pr[..own]);
        pr[..own].iter_mut().for_each(|s| *s *= inv);
        // dP = g v^T, then dS = P * (dP - sum(P * dP)), scaled for q and k.
        let dot = lane_dot(&pr[..own], &dpr[..own]);
        for (s, &pw) in dpr[..own].iter_mut().zip(pr.iter()) {
            *s = pw * (*s - dot) * y.scale;
        }
        pr[seen..].fill(0.0);
        dpr[seen..].fill(0.0);
    }
    let full = d / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        dq_cols::<R, LANES>((dp, stride), (y.k, y.kr), (first, end, c), (dq, d));
    }
    for c in full..d {
        dq_cols::<R, 1>((dp, stride), (y.k, y.kr), (first, end, c), (dq, d));
    }
}

/// Query rows `first..first + rows`: their weights and weight gradients (groups of `ROWS`),
/// their dq, and their contributions to dk and dv of every key they see.
#[inline(always)]
fn backward_chunk<const KW: usize>(
    x: &SliceData<'_>,
    y: &BackwardData<'_>,
    (first, rows): (usize, usize),
    (p, dp): (&mut [f32], &mut [f32]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let d = x.d;
    let end = x.key_end(first + rows - 1);
    let width = padded(end);
    let mut r = 0;
    while r + ROWS <= rows {
        backward_rows::<ROWS, KW>(x, y, (first + r, r, width), (p, dp), dq);
        r += ROWS;
    }
    while r < rows {
        backward_rows::<1, KW>(x, y, (first + r, r, width), (p, dp), dq);
        r += 1;
    }
    let (ds, p) = (&*dp, &*p);
    let full = d / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        dkv_cols::<LANES>(
            x,
            (ds, p, x.stride),
            ((x.q, x.qr), (y.g, y.gr), d),
            (first, rows, end, c),
            (dk, dv),
        );
    }
    for c in full..d {
        dkv_cols::<1>(
            x,
            (ds, p, x.stride),
            ((x.q, x.qr), (y.g, y.gr), d),
            (first, rows, end, c),
            (dk, dv),
        );
    }
}

/// The q, k and v gradient rows of one slice (q, k and v of one shape `T x D`).
#[inline(always)]
pub(super) fn backward_slice<const KW: usize>(
    a: &Slice<'_, '_>,
    w: &mut Scratch,
    g: &Rows<'_>,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (q, k, v) = (a.q, a.k, a.v);
    let (t, d) = (q.rows, q.cols);
    let stride = padded(t);
    transpose_padded(k.slice(a.s), (t, d), a.scale, stride, &mut w.kt);
    transpose_padded(v.slice(a.s), (t, d), 1.0, stride, &mut w.vt);
    let chunk = QUERY_CHUNK.min(t);
    w.p.resize(chunk * stride, 0.0);
    w.dp.resize(chunk * stride, 0.0);
    let (qd, qr) = q.slice_into(a.s, &mut w.q);
    let (kd, kr) = k.slice_into(a.s, &mut w.k);
    let (gd, gr) = g.slice_into(a.s, &mut w.g);
    let x = SliceData {
        q: qd,
        qr,
        kt: &w.kt,
        stride,
        tk: t,
        d,
        causal: a.causal,
    };
    let y = BackwardData {
        k: kd,
        kr,
        g: gd,
        gr,
        vt: &w.vt,
        scale: a.scale,
    };
    for first in (0..t).step_by(QUERY_CHUNK) {
        let rows = QUERY_CHUNK.min(t - first);
        backward_chunk::<KW>(&x, &y, (first, rows), (&mut w.p, &mut w.dp), (dq, dk, dv));
    }
}
