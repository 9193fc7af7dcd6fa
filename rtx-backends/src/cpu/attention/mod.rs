//! Scaled dot-product attention, flash-style: `softmax(q k^T / sqrt(D)) v` per batch slice,
//! with an online softmax over blocks of `KEY_BLOCK` keys (a running maximum and sum, the
//! partial output rescaled when the maximum grows), so no `[Tq, Tk]` matrix is ever stored: a
//! slice touches its q, k and v rows and the scores of a few query rows against one block of
//! keys. The backward pass recomputes the weights of 64 query rows at a time (`64 x Tk`
//! values) instead of saving them. `slice.rs` holds the per-slice kernels (query rows in
//! register tiles).
//!
//! Slices (every index of the batch axes) run in parallel, each writing only its own rows, and
//! every sum runs in a fixed order, so results do not depend on the thread count. Rows may be
//! strided (the heads of `split_heads` are a permuted view); the feature axis is read with
//! unit stride, or the operand is copied contiguous first.

use super::check::{self, KResult, KernelError};
use super::strided::{numel, position, to_contiguous};
use crate::layout::{Dims, Layout};
use rayon::prelude::*;
use std::borrow::Cow;

mod slice;
use slice::{ROWS, WIDE_ROWS, backward_slice, forward_slice};

/// Keys per block of the online softmax: the scores of a few query rows against one block
/// stay in registers.
const KEY_BLOCK: usize = 32;

/// Whether score tiles are a whole key block wide (AVX-512's 32 registers hold `ROWS x
/// KEY_BLOCK` sums and their operands) or half of one (AVX2 and narrower, where a whole block
/// spilled to the stack). Only the speed depends on it: each score sums in order either way.
fn wide_tiles() -> bool {
    super::simd::simd_level() == super::simd::SimdLevel::Avx512
}

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

    /// Slice `s` in place: its data from the first row on and the distance between its rows
    /// (`rows` rows of `cols` values). The forward pass reads q and v with that row stride,
    /// and both passes transpose k and v straight from it, so a head view of `[B, T, H, D]`
    /// costs no copy there (copying every operand per slice row by row, as 128-byte
    /// `memmove`s, was a tenth of the GPT's attention time).
    fn slice(&self, s: usize) -> (&[f32], usize) {
        let r = self.layout.shape.len();
        let base =
            self.layout.offset + position(s, self.batch_shape(), &self.layout.strides[..r - 2]);
        (
            &self.data[base.min(self.data.len())..],
            self.layout.strides[r - 2],
        )
    }

    /// Slice `s` copied into `out` as contiguous `rows x cols`, returned as [`Rows::slice`]
    /// returns it in place. The backward pass reads q, k and g over and over: in place, rows
    /// a power of two apart (a head view's 512 bytes) fall into a few L1 sets and evict each
    /// other, which made it 5% slower than copying them first.
    fn slice_into<'o>(&self, s: usize, out: &'o mut Vec<f32>) -> (&'o [f32], usize) {
        let (data, stride) = self.slice(s);
        out.clear();
        for i in 0..self.rows {
            out.extend_from_slice(&data[i * stride..i * stride + self.cols]);
        }
        (out, self.cols)
    }
}

/// Per-task buffers: the backward pass's q, k and g rows, k (scaled by 1/sqrt(D)) and v
/// transposed with zero columns up to a whole number of key blocks, the weights (and their
/// gradients) of one chunk of query rows, and a group's partial outputs.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    g: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
    p: Vec<f32>,
    dp: Vec<f32>,
    acc: Vec<f32>,
}

thread_local! {
    /// Each thread's [`Scratch`], kept between calls: rayon's `for_each_init` makes a fresh
    /// one per task it splits off, and their growing vectors were a GPT step's only
    /// allocations after the first (hundreds per step).
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::default();
}

/// Runs `f` with this thread's [`Scratch`], taken out for the call and put back after (a
/// call nested in it would start from an empty one).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut w = SCRATCH.try_with(std::cell::Cell::take).unwrap_or_default();
    let r = f(&mut w);
    let _ = SCRATCH.try_with(|cell| cell.set(w));
    r
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

/// What one slice's work reads (`s`, the slice, set per task).
struct Slice<'a, 'b> {
    q: &'a Rows<'b>,
    k: &'a Rows<'b>,
    v: &'a Rows<'b>,
    s: usize,
    causal: bool,
    scale: f32,
}

impl<'a, 'b> Slice<'a, 'b> {
    /// Slice 0 of the operands, with the scale 1/sqrt(D) of q's width; tasks change `s`.
    fn first(q: &'a Rows<'b>, k: &'a Rows<'b>, v: &'a Rows<'b>, causal: bool) -> Self {
        Slice {
            q,
            k,
            v,
            s: 0,
            causal,
            scale: 1.0 / (q.cols as f32).sqrt(),
        }
    }
}

/// `softmax(q k^T / sqrt(D)) v` over the last two axes of `[.., Tq, D]`, `[.., Tk, D]` and
/// `[.., Tk, Dv]` (batch axes equal); with `causal`, key `j` is hidden from query `i` when
/// `j > i`. Returns the contiguous `[.., Tq, Dv]` output and its shape.
pub fn attention(
    q: (&[f32], &Layout),
    k: (&[f32], &Layout),
    v: (&[f32], &Layout),
    causal: bool,
) -> KResult<(Vec<f32>, Dims)> {
    attention_into(q, k, v, causal, crate::pool::take)
}

/// [`attention`] writing into the buffer `out(len)` returns for the output's `len` values,
/// which must hold exactly `len` (none is read).
pub fn attention_into<B: AsMut<[f32]>>(
    q: (&[f32], &Layout),
    k: (&[f32], &Layout),
    v: (&[f32], &Layout),
    causal: bool,
    out: impl FnOnce(usize) -> B,
) -> KResult<(B, Dims)> {
    const K: &str = "attention";
    let [q, k, v] = operands(K, q, k, v, causal)?;
    let (tq, tk, dv) = (q.rows, k.rows, v.cols);
    let mut shape = q.layout.shape.clone();
    *shape.last_mut().unwrap_or(&mut 0) = dv;
    let slices = numel(q.batch_shape());
    let len = slices * tq * dv;
    let mut buffer = out(len);
    let out = buffer.as_mut();
    check::argument(K, out.len() == len, || {
        format!("an output buffer of {len} values, got {}", out.len())
    })?;
    if out.is_empty() || tk == 0 {
        out.fill(0.0);
        return Ok((buffer, shape));
    }
    let every = Slice::first(&q, &k, &v, causal);
    let wide_tiles = wide_tiles();
    out.par_chunks_mut(tq * dv)
        .enumerate()
        .for_each(|(s, out)| {
            with_scratch(|w| {
                let a = Slice { s, ..every };
                // Inlined into `widest`'s copy for the CPU's vector width (a closure
                // left as a call of its own was compiled for the baseline).
                if wide_tiles {
                    super::simd::widest(
                        #[inline(always)]
                        || forward_slice::<WIDE_ROWS, KEY_BLOCK>(&a, w, out),
                    )
                } else {
                    super::simd::widest(
                        #[inline(always)]
                        || forward_slice::<ROWS, { KEY_BLOCK / 2 }>(&a, w, out),
                    )
                }
            })
        });
    Ok((buffer, shape))
}

/// The gradients of [`attention`] with respect to q, k and v, given the output gradient `g`
/// (`[.., Tq, Dv]`), for q, k and v of one shape: returned stacked, `[3, ..q.shape]`.
pub fn attention_grad(
    q: (&[f32], &Layout),
    k: (&[f32], &Layout),
    v: (&[f32], &Layout),
    g: (&[f32], &Layout),
    causal: bool,
) -> KResult<(Vec<f32>, Dims)> {
    attention_grad_into(q, k, v, g, causal, crate::pool::take)
}

/// [`attention_grad`] writing into the buffer `out(len)` returns for the stacked gradients'
/// `len` values, which must hold exactly `len` (it is cleared first: keys and values sum
/// their gradients over the query blocks).
pub fn attention_grad_into<B: AsMut<[f32]>>(
    q: (&[f32], &Layout),
    k: (&[f32], &Layout),
    v: (&[f32], &Layout),
    g: (&[f32], &Layout),
    causal: bool,
    out: impl FnOnce(usize) -> B,
) -> KResult<(B, Dims)> {
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
    let mut shape = Dims::from_slice(&[3]);
    shape.extend_from_slice(&q.layout.shape);
    let mut buffer = out(3 * part);
    let out = buffer.as_mut();
    check::argument(K, out.len() == 3 * part, || {
        format!("an output buffer of {} values, got {}", 3 * part, out.len())
    })?;
    out.fill(0.0);
    if part == 0 {
        return Ok((buffer, shape));
    }
    let every = Slice::first(&q, &k, &v, causal);
    let wide_tiles = wide_tiles();
    let (dq, rest) = out.split_at_mut(part);
    let (dk, dv) = rest.split_at_mut(part);
    dq.par_chunks_mut(t * d)
        .zip(dk.par_chunks_mut(t * d))
        .zip(dv.par_chunks_mut(t * d))
        .enumerate()
        .for_each(|(s, ((dq, dk), dv))| {
            with_scratch(|w| {
                let a = Slice { s, ..every };
                if wide_tiles {
                    super::simd::widest(
                        #[inline(always)]
                        || backward_slice::<KEY_BLOCK>(&a, w, &g, (dq, dk, dv)),
                    )
                } else {
                    super::simd::widest(
                        #[inline(always)]
                        || backward_slice::<{ KEY_BLOCK / 2 }>(&a, w, &g, (dq, dk, dv)),
                    )
                }
            })
        });
    Ok((buffer, shape))
}
