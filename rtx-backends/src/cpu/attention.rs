//! Scaled dot-product attention, flash-style: `softmax(q k^T / sqrt(D)) v` per batch slice,
//! computed one query row at a time with an online softmax over blocks of `KEY_BLOCK` keys
//! (a running maximum and sum, the partial output rescaled when the maximum grows), so no
//! `[Tq, Tk]` matrix is ever stored: a slice touches its q, k and v rows and a block of
//! scores. The backward pass recomputes each query row's weights (one row of `Tk` values at a
//! time) instead of saving them.
//!
//! Slices (every index of the batch axes) run in parallel, each writing only its own rows, and
//! every sum runs in a fixed order, so results do not depend on the thread count. Rows may be
//! strided (the heads of `split_heads` are a permuted view); the feature axis is read with
//! unit stride, or the operand is copied contiguous first.

use super::check::{self, KResult, KernelError};
use super::scalar::exp;
use super::strided::{numel, position, to_contiguous};
use crate::layout::Layout;
use rayon::prelude::*;
use std::borrow::Cow;

/// Keys per block of the online softmax: the scores of one block stay in registers / L1.
const KEY_BLOCK: usize = 32;

/// One operand seen as `slices` matrices of `rows x cols` with unit column stride.
struct Rows<'a> {
    data: Cow<'a, [f32]>,
    layout: Layout,
    rows: usize,
    cols: usize,
}

impl<'a> Rows<'a> {
    fn new(
        kernel: &'static str,
        arg: &'static str,
        data: &'a [f32],
        l: &Layout,
    ) -> KResult<Rows<'a>> {
        check::view(kernel, arg, data.len(), l)?;
        let r = l.shape.len();
        if r < 2 {
            return Err(KernelError::Shapes {
                kernel,
                detail: format!("`{arg}` needs [.., T, D] axes, found {:?}", &l.shape[..]),
            });
        }
        let (rows, cols) = (l.shape[r - 2], l.shape[r - 1]);
        if l.strides[r - 1] == 1 || cols == 1 {
            return Ok(Rows {
                data: Cow::Borrowed(data),
                layout: l.clone(),
                rows,
                cols,
            });
        }
        let copy = to_contiguous(data, l)?;
        Ok(Rows {
            data: Cow::Owned(copy),
            layout: Layout::contiguous(&l.shape),
            rows,
            cols,
        })
    }

    fn batch_shape(&self) -> &[usize] {
        &self.layout.shape[..self.layout.shape.len() - 2]
    }

    /// Slice `s` copied into `out` as contiguous `rows x cols` (a few KiB that then stay in
    /// L1, read with unit stride however the operand is laid out).
    fn slice_into(&self, s: usize, out: &mut Vec<f32>) {
        let r = self.layout.shape.len();
        let base =
            self.layout.offset + position(s, self.batch_shape(), &self.layout.strides[..r - 2]);
        let row_stride = self.layout.strides[r - 2];
        out.clear();
        for i in 0..self.rows {
            let at = base + i * row_stride;
            out.extend_from_slice(&self.data[at..at + self.cols]);
        }
    }
}

/// Per-task buffers: the slice's q, k, v (and g) rows, transposed k (and v), a block or row
/// of scores and an accumulator.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
    p: Vec<f32>,
    dp: Vec<f32>,
    acc: Vec<f32>,
}

/// The operands, checked: equal batch axes, q and k of one width, one value row per key, and
/// as many queries as keys when `causal`.
fn operands<'a>(
    kernel: &'static str,
    (q, lq): (&'a [f32], &Layout),
    (k, lk): (&'a [f32], &Layout),
    (v, lv): (&'a [f32], &Layout),
    causal: bool,
) -> KResult<[Rows<'a>; 3]> {
    let (q, k, v) = (
        Rows::new(kernel, "q", q, lq)?,
        Rows::new(kernel, "k", k, lk)?,
        Rows::new(kernel, "v", v, lv)?,
    );
    let fits = q.batch_shape() == k.batch_shape()
        && k.batch_shape() == v.batch_shape()
        && q.cols == k.cols
        && k.rows == v.rows
        && (!causal || q.rows == k.rows);
    check::shapes(kernel, fits, || {
        format!(
            "q {:?}, k {:?}, v {:?} do not fit [.., Tq, D], [.., Tk, D], [.., Tk, Dv]{}",
            &q.layout.shape[..],
            &k.layout.shape[..],
            &v.layout.shape[..],
            if causal { " with Tq == Tk" } else { "" }
        )
    })?;
    check::elements(kernel, &q.layout.shape)?;
    check::elements(kernel, &v.layout.shape)?;
    Ok([q, k, v])
}

/// `m` (`rows x cols`, contiguous) transposed into `t`: `t[c * rows + j] = m[j * cols + c]`.
fn transpose_into(m: &[f32], rows: usize, cols: usize, t: &mut Vec<f32>) {
    t.clear();
    t.resize(rows * cols, 0.0);
    for (j, row) in m.chunks_exact(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            t[c * rows + j] = x;
        }
    }
}

/// Independent accumulators of the sums and maxima over a row of scores: one chain each, so
/// the loops vectorize (a single running sum is a chain the compiler must keep in order).
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

/// `scores[j] = scale * q_i . k_j` for `j` in `keys`, from the transposed keys.
#[inline(always)]
fn scores(
    q_row: &[f32],
    kt: &[f32],
    tk: usize,
    keys: std::ops::Range<usize>,
    scale: f32,
    out: &mut [f32],
) {
    let out = &mut out[..keys.len()];
    out.fill(0.0);
    for (d, &qd) in q_row.iter().enumerate() {
        let qd = qd * scale;
        let kd = &kt[d * tk + keys.start..d * tk + keys.end];
        for (o, &kv) in out.iter_mut().zip(kd) {
            *o += qd * kv;
        }
    }
}

/// What one slice's work reads.
struct Slice<'a, 'b> {
    q: &'a Rows<'b>,
    k: &'a Rows<'b>,
    v: &'a Rows<'b>,
    s: usize,
    causal: bool,
    scale: f32,
}

/// Runs `$f(args..)` through the widest vector instructions the CPU has: the same code
/// compiled for AVX-512, AVX2 + FMA or the baseline (each element's arithmetic is the same
/// and every sum keeps its order, so all three give the same bits).
macro_rules! dispatch {
    ($f:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                unsafe { wide::$f::avx512($($arg),*) }
            } else if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { wide::$f::avx2($($arg),*) }
            } else {
                $f($($arg),*)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $f($($arg),*)
        }
    }};
}

/// Copies of the slice kernels compiled with wider vector instructions enabled.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::*;

    macro_rules! widen {
        ($f:ident($($arg:ident: $t:ty),*)) => {
            pub mod $f {
                use super::*;
                /// # Safety
                /// The CPU has AVX-512F.
                #[target_feature(enable = "avx512f")]
                pub unsafe fn avx512($($arg: $t),*) {
                    super::super::$f($($arg),*)
                }
                /// # Safety
                /// The CPU has AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                pub unsafe fn avx2($($arg: $t),*) {
                    super::super::$f($($arg),*)
                }
            }
        };
    }

    widen!(forward_slice(a: &Slice<'_, '_>, w: &mut Scratch, out: &mut [f32]));
    widen!(backward_slice(a: &Slice<'_, '_>, w: &mut Scratch, g: &Rows<'_>, grads: (&mut [f32], &mut [f32], &mut [f32])));
}

/// `softmax(q k^T / sqrt(D)) v` over the last two axes of `[.., Tq, D]`, `[.., Tk, D]` and
/// `[.., Tk, Dv]` (batch axes equal); with `causal`, key `j` is hidden from query `i` when
/// `j > i`. Returns the contiguous `[.., Tq, Dv]` output and its shape.
pub fn attention(
    q: (&[f32], &Layout),
    k: (&[f32], &Layout),
    v: (&[f32], &Layout),
    causal: bool,
) -> KResult<(Vec<f32>, Vec<usize>)> {
    let [q, k, v] = operands("attention", q, k, v, causal)?;
    let (tq, tk, d, dv) = (q.rows, k.rows, q.cols, v.cols);
    let mut shape = q.layout.shape.to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = dv;
    let slices = numel(q.batch_shape());
    let mut out = crate::pool::take(slices * tq * dv);
    if out.is_empty() || tk == 0 {
        out.fill(0.0);
        return Ok((out, shape));
    }
    let scale = 1.0 / (d as f32).sqrt();
    out.par_chunks_mut(tq * dv)
        .enumerate()
        .for_each_init(Scratch::default, |w, (s, out)| {
            let a = Slice {
                q: &q,
                k: &k,
                v: &v,
                s,
                causal,
                scale,
            };
            dispatch!(forward_slice(&a, w, out))
        });
    Ok((out, shape))
}

/// The gradients of [`attention`] with respect to q, k and v, given the output gradient `g`
/// (`[.., Tq, Dv]`), for q, k and v of one shape: returned stacked, `[3, ..q.shape]`.
pub fn attention_grad(
    q: (&[f32], &Layout),
    k: (&[f32], &Layout),
    v: (&[f32], &Layout),
    g: (&[f32], &Layout),
    causal: bool,
) -> KResult<(Vec<f32>, Vec<usize>)> {
    const K: &str = "attention_grad";
    let [q, k, v] = operands(K, q, k, v, causal)?;
    let g = Rows::new(K, "g", g.0, g.1)?;
    check::shapes(
        K,
        q.layout.shape == k.layout.shape && k.layout.shape == v.layout.shape,
        || {
            format!(
                "the stacked gradient needs q, k and v of one shape, found {:?}, {:?}, {:?}",
                &q.layout.shape[..],
                &k.layout.shape[..],
                &v.layout.shape[..]
            )
        },
    )?;
    check::shapes(K, g.layout.shape == q.layout.shape, || {
        format!(
            "the output gradient is {:?}, the output {:?}",
            &g.layout.shape[..],
            &q.layout.shape[..]
        )
    })?;
    let (t, d) = (q.rows, q.cols);
    let slices = numel(q.batch_shape());
    let part = slices * t * d;
    let mut shape = vec![3];
    shape.extend_from_slice(&q.layout.shape);
    let mut out = crate::pool::take(3 * part);
    out.fill(0.0);
    if part == 0 {
        return Ok((out, shape));
    }
    let scale = 1.0 / (d as f32).sqrt();
    let (dq, rest) = out.split_at_mut(part);
    let (dk, dv) = rest.split_at_mut(part);
    dq.par_chunks_mut(t * d)
        .zip(dk.par_chunks_mut(t * d))
        .zip(dv.par_chunks_mut(t * d))
        .enumerate()
        .for_each_init(Scratch::default, |w, (s, ((dq, dk), dv))| {
            let a = Slice {
                q: &q,
                k: &k,
                v: &v,
                s,
                causal,
                scale,
            };
            dispatch!(backward_slice(&a, w, &g, (dq, dk, dv)))
        });
    Ok((out, shape))
}

/// The output rows of one slice (`Tq x Dv`), query by query, keys in blocks.
#[inline(always)]
fn forward_slice(a: &Slice<'_, '_>, w: &mut Scratch, out: &mut [f32]) {
    let (q, k, v, s, causal, scale) = (a.q, a.k, a.v, a.s, a.causal, a.scale);
    let (tk, d, dv) = (k.rows, q.cols, v.cols);
    q.slice_into(s, &mut w.q);
    k.slice_into(s, &mut w.k);
    v.slice_into(s, &mut w.v);
    transpose_into(&w.k, tk, d, &mut w.kt);
    w.p.resize(KEY_BLOCK, 0.0);
    w.acc.resize(dv, 0.0);
    let (block, acc) = (&mut w.p[..KEY_BLOCK], &mut w.acc[..dv]);
    for (i, o) in out.chunks_exact_mut(dv).enumerate() {
        let end = if causal { i + 1 } else { tk };
        let q_row = &w.q[i * d..(i + 1) * d];
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        acc.fill(0.0);
        for start in (0..end).step_by(KEY_BLOCK) {
            let keys = start..(start + KEY_BLOCK).min(end);
            let n = keys.len();
            scores(q_row, &w.kt, tk, keys.clone(), scale, block);
            let block_max = lane_max(&block[..n]);
            let new_max = max.max(block_max);
            // Rescale what the earlier blocks added up under the old maximum.
            if max != f32::NEG_INFINITY && new_max > max {
                let rescale = exp(max - new_max);
                sum *= rescale;
                acc.iter_mut().for_each(|a| *a *= rescale);
            }
            for p in &mut block[..n] {
                *p = exp(*p - new_max);
            }
            sum += lane_sum(&block[..n]);
            let values = &w.v[keys.start * dv..keys.end * dv];
            for (&p, v_row) in block[..n].iter().zip(values.chunks_exact(dv)) {
                for (a, &x) in acc.iter_mut().zip(v_row) {
                    *a += p * x;
                }
            }
            max = new_max;
        }
        let inv = 1.0 / sum;
        for (o, &a) in o.iter_mut().zip(acc.iter()) {
            *o = a * inv;
        }
    }
}

/// The q, k and v gradient rows of one slice, query row by query row.
#[inline(always)]
fn backward_slice(
    a: &Slice<'_, '_>,
    w: &mut Scratch,
    g: &Rows<'_>,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (q, k, v, s, causal, scale) = (a.q, a.k, a.v, a.s, a.causal, a.scale);
    let (t, d) = (q.rows, q.cols);
    q.slice_into(s, &mut w.q);
    k.slice_into(s, &mut w.k);
    v.slice_into(s, &mut w.v);
    g.slice_into(s, &mut w.g);
    transpose_into(&w.k, t, d, &mut w.kt);
    transpose_into(&w.v, t, d, &mut w.vt);
    w.p.resize(t, 0.0);
    w.dp.resize(t, 0.0);
    let (p, dp) = (&mut w.p[..t], &mut w.dp[..t]);
    for i in 0..t {
        let end = if causal { i + 1 } else { t };
        let (q_row, g_row) = (&w.q[i * d..(i + 1) * d], &w.g[i * d..(i + 1) * d]);
        // This row's weights, recomputed.
        scores(q_row, &w.kt, t, 0..end, scale, p);
        let max = lane_max(&p[..end]);
        for x in &mut p[..end] {
            *x = exp(*x - max);
        }
        let inv = 1.0 / lane_sum(&p[..end]);
        p[..end].iter_mut().for_each(|x| *x *= inv);
        // dP = g v^T, then dS = P * (dP - sum(P * dP)), scaled for q and k.
        scores(g_row, &w.vt, t, 0..end, 1.0, dp);
        let dot = lane_dot(&p[..end], &dp[..end]);
        for (x, &pw) in dp[..end].iter_mut().zip(&p[..end]) {
            *x = pw * (*x - dot) * scale;
        }
        let dq_row = &mut dq[i * d..(i + 1) * d];
        let rows = w.k[..end * d]
            .chunks_exact(d)
            .zip(dk[..end * d].chunks_exact_mut(d))
            .zip(dv[..end * d].chunks_exact_mut(d));
        for (j, ((k_row, dk_row), dv_row)) in rows.enumerate() {
            let (ds, pw) = (dp[j], p[j]);
            for (o, &x) in dq_row.iter_mut().zip(k_row) {
                *o += ds * x;
            }
            for (o, &x) in dk_row.iter_mut().zip(q_row) {
                *o += ds * x;
            }
            for (o, &x) in dv_row.iter_mut().zip(g_row) {
                *o += pw * x;
            }
        }
    }
}
