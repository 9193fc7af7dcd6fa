//! The float64 reference semantics of every op.
//!
//! This is the definition every fast backend is tested against, so it is written to be
//! obviously correct rather than fast: plain nested loops over dense row-major arrays, one
//! function per op, no views, no threads. The semantics are PyTorch's (see each op below).
//!
//! Nothing here panics on bad input: `eval` and `run` check ranks, shapes, element counts,
//! labels and ids, and return a worded `Err` instead.
//!
//! Conventions shared by every op:
//! - an `Array` is dense and row-major; integer tensors (labels, ids) hold integral values;
//! - "first" (of a maximum, in a reduction group or a pooling window) means first in row-major
//!   order of the input, which is where PyTorch's CPU kernels route the gradient;
//! - a NaN beats every number in a maximum (PyTorch propagates NaN through `max`).

// One file on purpose for the most part: `eval` is a single exhaustive `match` over `Op`, so
// a new core op does not compile until its meaning is written, and the helpers every op
// shares (broadcasting, reductions, windows) sit beside it. Ops with a reference of their own
// length and no shared helpers live in `reference/` (attention, top-k).
mod attention;
mod top_k;

use crate::dim::{Atom, Dim};
use crate::graph::Graph;
use crate::op::{AutocastMode, DType, Op, Precision};
use std::collections::HashMap;

/// A dense row-major float64 array. Integer tensors (labels, ids) hold integral values.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Array {
    /// # Panics
    /// When `data.len()` is not the product of `shape` (a construction bug in the caller).
    /// `eval` re-checks arrays built as struct literals and reports an `Err` instead.
    pub fn new(shape: Vec<usize>, data: Vec<f64>) -> Array {
        let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        assert_eq!(
            n,
            Some(data.len()),
            "Array::new: shape {shape:?} does not hold {} elements",
            data.len()
        );
        Array { shape, data }
    }

    /// A rank-0 array.
    pub fn scalar(v: f64) -> Array {
        Array {
            shape: vec![],
            data: vec![v],
        }
    }

    /// An array of zeros. The caller guarantees that the element count fits in memory.
    pub fn zeros(shape: Vec<usize>) -> Array {
        let n = shape.iter().product();
        Array {
            shape,
            data: vec![0.0; n],
        }
    }

    /// The number of elements the shape describes (`usize::MAX` if that overflows, which no
    /// real array can hold, so `eval` rejects it).
    pub fn numel(&self) -> usize {
        numel(&self.shape).unwrap_or(usize::MAX)
    }
}

/// Run-time context of a reference evaluation.
pub struct RefCtx<'a> {
    /// Values of symbolic dimensions and generic parameters, for `Reshape` targets.
    pub env: &'a HashMap<String, i64>,
    /// Training mode: `DropoutMask` drops elements only when true.
    pub train: bool,
    /// What `Autocast` and `AutocastGrad` round to (`AutocastMode::OFF`: nothing).
    pub autocast: AutocastMode,
    /// Seed of the dropout hash (see [`dropout_uniform`]) for `eval`; `run` treats it as the
    /// seed of a stream and gives each dropout node the next value, like `Ctx::train(seed)`.
    pub seed: u64,
}

type R<T> = Result<T, String>;

// ------------------------------------------------------------------------------------------
// Dropout hash
// ------------------------------------------------------------------------------------------

/// The uniform number in `[0, 1)` that decides whether element `index` of a dropout mask is
/// kept, for a given `seed`. It is one splitmix64 step over a counter, so every element is
/// independent of every other and of the order of evaluation, and the CPU kernel computes
/// exactly the same bits:
///
/// ```text
/// z = seed + (index + 1) * 0x9E3779B97F4A7C15          (wrapping)
/// z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9             (wrapping)
/// z = (z ^ (z >> 27)) * 0x94D049BB133111EB             (wrapping)
/// z = z ^ (z >> 31)
/// u = (z >> 40) / 2^24                                 (24 bits, exact in f32 and f64)
/// ```
///
/// The element is kept when `u >= p`.
pub fn dropout_uniform(seed: u64, index: u64) -> f64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f64 / (1u64 << 24) as f64
}

/// One element of a training-mode dropout mask: `0` when dropped, `1 / (1 - p)` when kept.
pub fn dropout_mask_value(seed: u64, index: u64, p: f64) -> f64 {
    if dropout_uniform(seed, index) >= p {
        1.0 / (1.0 - p)
    } else {
        0.0
    }
}

// ------------------------------------------------------------------------------------------
// Index arithmetic
// ------------------------------------------------------------------------------------------

/// The most elements an array may have: more could not be allocated without a capacity
/// overflow panic.
const MAX_ELEMENTS: usize = isize::MAX as usize / std::mem::size_of::<f64>();

/// The element count of a shape, or an error if it is more than memory can hold. Products
/// are checked left to right, so `[huge, huge, 0]` is rejected while `[0, huge]` has 0
/// elements; a sub-shape of an accepted shape (`[huge]` of `[0, huge]`) can still overflow,
/// so every sub-product is taken with `numel` as well.
fn numel(shape: &[usize]) -> R<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| {
            acc.checked_mul(d).filter(|&n| n <= MAX_ELEMENTS)
        })
        .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))
}

/// The multi-index of flat position `flat` in `shape`.
fn unravel(mut flat: usize, shape: &[usize], idx: &mut [usize]) {
    for k in (0..shape.len()).rev() {
        let d = shape[k].max(1);
        idx[k] = flat % d;
        flat /= d;
    }
}

/// The flat position of `idx` in `shape`.
fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// The flat position in an operand of shape `src` of the element that NumPy broadcasting
/// sends to position `idx` of the (larger) broadcast result: leading axes are dropped and
/// size-1 axes pinned to 0.
fn broadcast_source(idx: &[usize], src: &[usize]) -> usize {
    let offset = idx.len() - src.len();
    src.iter().enumerate().fold(0, |acc, (k, &d)| {
        acc * d + if d == 1 { 0 } else { idx[k + offset] }
    })
}

/// NumPy broadcasting of two shapes.
fn broadcast_shape(a: &[usize], b: &[usize]) -> R<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("cannot broadcast {a:?} with {b:?}: dimension {da} does not match {db} and neither is 1")),
        });
    }
    Ok(out)
}

/// Splits `shape` around `axis` into (outer, len, inner) so that element `(o, j, i)` lives at
/// `(o * len + j) * inner + i`.
fn split_at_axis(shape: &[usize], axis: usize) -> R<(usize, usize, usize)> {
    Ok((
        numel(&shape[..axis])?,
        shape[axis],
        numel(&shape[axis + 1..])?,
    ))
}

fn need_rank(a: &Array, rank: usize, what: &str) -> R<()> {
    if a.shape.len() != rank {
        return Err(format!(
            "{what} needs a rank-{rank} array, found shape {:?}",
            a.shape
        ));
    }
    Ok(())
}

fn need_same_shape(a: &Array, b: &Array, what: &str) -> R<()> {
    if a.shape != b.shape {
        return Err(format!(
            "{what} needs two arrays of the same shape, found {:?} and {:?}",
            a.shape, b.shape
        ));
    }
    Ok(())
}

fn need_axis(axis: usize, rank: usize, what: &str) -> R<()> {
    if axis >= rank {
        return Err(format!(
            "{what} axis {axis} is out of range for an array of rank {rank}"
        ));
    }
    Ok(())
}

/// An integral value in `0..bound`, as an index (a class label or an embedding id).
fn index_value(v: f64, bound: usize, what: &str, pos: usize) -> R<usize> {
    if !(v.is_finite() && v.fract() == 0.0 && v >= 0.0 && v < bound as f64) {
        return Err(format!(
            "{what} {v} at position {pos} is out of range: it must be an integer in 0..{bound}"
        ));
    }
    Ok(v as usize)
}

// ------------------------------------------------------------------------------------------
// Elementwise
// ------------------------------------------------------------------------------------------

/// `v` rounded to the nearest value of `precision` (to nearest even; past the largest finite
/// value, infinity), by the `half` crate's conversions: an implementation independent of the
/// kernels' bit manipulation.
pub fn round_to(v: f64, precision: Precision) -> f64 {
    match precision {
        Precision::F32 => v,
        Precision::Bf16 => half::bf16::from_f64(v).to_f64(),
        Precision::F16 => half::f16::from_f64(v).to_f64(),
    }
}

fn unary(x: &Array, f: impl Fn(f64) -> f64) -> Array {
    Array {
        shape: x.shape.clone(),
        data: x.data.iter().map(|&v| f(v)).collect(),
    }
}

/// `f(a, b)` with NumPy broadcasting.
fn binary(a: &Array, b: &Array, f: impl Fn(f64, f64) -> f64) -> R<Array> {
    let shape = broadcast_shape(&a.shape, &b.shape)?;
    let n = numel(&shape)?;
    let mut idx = vec![0; shape.len()];
    let mut data = Vec::with_capacity(n);
    for flat in 0..n {
        unravel(flat, &shape, &mut idx);
        data.push(f(
            a.data[broadcast_source(&idx, &a.shape)],
            b.data[broadcast_source(&idx, &b.shape)],
        ));
    }
    Ok(Array { shape, data })
}

/// `f(x, g)` for two arrays of one shape (the backward elementwise ops).
fn zip_same(x: &Array, g: &Array, what: &str, f: impl Fn(f64, f64) -> f64) -> R<Array> {
    need_same_shape(x, g, what)?;
    Ok(Array {
        shape: x.shape.clone(),
        data: x.data.iter().zip(&g.data).map(|(&a, &b)| f(a, b)).collect(),
    })
}

fn relu(x: f64) -> f64 {
    // NaN stays NaN, as in PyTorch.
    if x > 0.0 || x.is_nan() { x } else { 0.0 }
}

/// Standard normal CDF.
fn phi_cdf(x: f64) -> f64 {
    0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// Standard normal density.
fn phi_pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Exact (erf) GELU, PyTorch's default `approximate='none'`.
fn gelu(x: f64) -> f64 {
    x * phi_cdf(x)
}

fn gelu_grad(x: f64) -> f64 {
    phi_cdf(x) + x * phi_pdf(x)
}

/// sqrt(2 / pi), the tanh approximation's scale.
const GELU_TANH_SCALE: f64 = 0.797_884_560_802_865_4;

/// GELU's tanh approximation, PyTorch's `approximate='tanh'`.
fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_TANH_SCALE * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_tanh_grad(x: f64) -> f64 {
    let t = (GELU_TANH_SCALE * (x + 0.044715 * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_TANH_SCALE * (1.0 + 3.0 * 0.044715 * x * x)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------

/// A reduction over `axes` of an input shape: which axes are reduced, the result shape with
/// reduced axes kept as 1 (`kept`) and the result shape as the op returns it (`out`).
struct Reduction {
    reduced: Vec<bool>,
    kept: Vec<usize>,
    out: Vec<usize>,
    /// Elements per group (product of the reduced dimensions).
    count: usize,
    /// Number of groups (elements of the result).
    groups: usize,
}

impl Reduction {
    fn new(shape: &[usize], axes: &[usize], keepdim: bool, what: &str) -> R<Reduction> {
        let mut reduced = vec![false; shape.len()];
        for &a in axes {
            need_axis(a, shape.len(), what)?;
            reduced[a] = true;
        }
        let kept: Vec<usize> = shape
            .iter()
            .zip(&reduced)
            .map(|(&d, &r)| if r { 1 } else { d })
            .collect();
        let out = if keepdim {
            kept.clone()
        } else {
            shape
                .iter()
                .zip(&reduced)
                .filter(|(_, r)| !**r)
                .map(|(&d, _)| d)
                .collect()
        };
        let reduced_dims: Vec<usize> = shape
            .iter()
            .zip(&reduced)
            .filter(|(_, r)| **r)
            .map(|(&d, _)| d)
            .collect();
        let count = numel(&reduced_dims)?;
        let groups = numel(&kept)?;
        Ok(Reduction {
            reduced,
            kept,
            out,
            count,
            groups,
        })
    }

    /// The group (flat position in the result) of input element `idx`. The result has the
    /// same flat layout with or without the kept size-1 axes.
    fn group(&self, idx: &[usize]) -> usize {
        idx.iter()
            .zip(&self.kept)
            .zip(&self.reduced)
            .fold(0, |acc, ((&i, &d), &r)| acc * d + if r { 0 } else { i })
    }

    /// Checks that `g` has the shape of this reduction's result.
    fn check_grad(&self, g: &Array, what: &str) -> R<()> {
        if g.shape != self.out {
            return Err(format!(
                "{what}: the gradient should have the reduced shape {:?}, found {:?}",
                self.out, g.shape
            ));
        }
        Ok(())
    }
}

fn sum(x: &Array, axes: &[usize], keepdim: bool, what: &str) -> R<Array> {
    let red = Reduction::new(&x.shape, axes, keepdim, what)?;
    let mut data = vec![0.0; red.groups];
    let mut idx = vec![0; x.shape.len()];
    for (flat, &v) in x.data.iter().enumerate() {
        unravel(flat, &x.shape, &mut idx);
        data[red.group(&idx)] += v;
    }
    Ok(Array {
        shape: red.out,
        data,
    })
}

/// True when `v` replaces `best` as the running maximum: strictly greater, so ties keep the
/// first; a NaN wins once and then stays.
fn beats(v: f64, best: f64) -> bool {
    !best.is_nan() && (v > best || v.is_nan())
}

/// The flat input position of the first maximum of every group.
fn argmax_groups(x: &Array, red: &Reduction, what: &str) -> R<Vec<usize>> {
    let groups = red.groups;
    if red.count == 0 && groups > 0 {
        return Err(format!(
            "{what} over an empty dimension has no maximum (input shape {:?})",
            x.shape
        ));
    }
    let mut best: Vec<Option<usize>> = vec![None; groups];
    let mut idx = vec![0; x.shape.len()];
    for (flat, &v) in x.data.iter().enumerate() {
        unravel(flat, &x.shape, &mut idx);
        let g = red.group(&idx);
        match best[g] {
            Some(b) if !beats(v, x.data[b]) => {}
            _ => best[g] = Some(flat),
        }
    }
    // Every group of a non-empty reduction received at least one element.
    Ok(best.into_iter().map(|b| b.unwrap_or(0)).collect())
}

// ------------------------------------------------------------------------------------------
// Linear algebra, softmax, losses
// ------------------------------------------------------------------------------------------

/// `[.., M, K] @ [.., K, N]` with NumPy broadcasting of the batch dimensions.
fn matmul(a: &Array, b: &Array) -> R<Array> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb < 2 {
        return Err(format!(
            "matmul needs operands of rank >= 2, found {:?} and {:?}",
            a.shape, b.shape
        ));
    }
    let (m, k) = (a.shape[ra - 2], a.shape[ra - 1]);
    let (k2, n) = (b.shape[rb - 2], b.shape[rb - 1]);
    if k != k2 {
        return Err(format!(
            "matmul inner dimensions differ: {:?} @ {:?} ({k} vs {k2})",
            a.shape, b.shape
        ));
    }
    let (abatch, bbatch) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let batch = broadcast_shape(abatch, bbatch)?;
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let total = numel(&shape)?;
    let mut data = vec![0.0; total];
    let mut idx = vec![0; batch.len()];
    for bi in 0..numel(&batch)? {
        unravel(bi, &batch, &mut idx);
        let a0 = broadcast_source(&idx, abatch) * m * k;
        let b0 = broadcast_source(&idx, bbatch) * k * n;
        let c0 = bi * m * n;
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    s += a.data[a0 + i * k + p] * b.data[b0 + p * n + j];
                }
                data[c0 + i * n + j] = s;
            }
        }
    }
    Ok(Array { shape, data })
}

/// The ids as positions along the last axis of `x [.., C]`; returns C and the positions.
fn pick_args(x_shape: &[usize], ids: &Array, what: &str) -> R<(usize, Vec<usize>)> {
    let Some((&c, rows)) = x_shape.split_last() else {
        return Err(format!(
            "{what} needs values with at least one axis, found a scalar"
        ));
    };
    if ids.shape != rows {
        return Err(format!(
            "{what}: the indices should have shape {rows:?} (one per row), found {:?}",
            ids.shape
        ));
    }
    let ids = ids
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| index_value(v, c, &format!("{what} index"), i))
        .collect::<R<Vec<_>>>()?;
    Ok((c, ids))
}

/// `out[r] = x[r, ids[r]]` over the rows `r` of the last axis.
fn pick(x: &Array, ids: &Array) -> R<Array> {
    let (c, ids) = pick_args(&x.shape, ids, "pick")?;
    Ok(Array {
        shape: ids_shape(&x.shape),
        data: ids
            .iter()
            .enumerate()
            .map(|(r, &j)| x.data[r * c + j])
            .collect(),
    })
}

/// Index of the largest value along `axis` (removed), the first on ties, NaN the largest.
fn argmax(x: &Array, axis: usize) -> R<Array> {
    let Some(&n) = x.shape.get(axis) else {
        return Err(format!(
            "argmax axis {axis} is out of range for rank {}",
            x.shape.len()
        ));
    };
    let inner: usize = x.shape[axis + 1..].iter().product();
    let outer: usize = x.shape[..axis].iter().product();
    let mut shape = x.shape.clone();
    shape.remove(axis);
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| x.data[(o * n + j) * inner + i];
            let mut best = 0;
            for j in 1..n {
                let (v, b) = (at(j), at(best));
                if !b.is_nan() && (v.is_nan() || v > b) {
                    best = j;
                }
            }
            data.push(best as f64);
        }
    }
    Ok(Array { shape, data })
}

/// Zeros of `x_like`'s shape with `g[r]` at `[r, ids[r]]`.
fn pick_grad(g: &Array, ids: &Array, x_like: &Array) -> R<Array> {
    let (c, ids) = pick_args(&x_like.shape, ids, "pick_grad")?;
    if g.shape != ids_shape(&x_like.shape) {
        return Err(format!(
            "pick_grad: the output gradient should have shape {:?}, found {:?}",
            ids_shape(&x_like.shape),
            g.shape
        ));
    }
    let mut out = Array::zeros(x_like.shape.clone());
    for (r, &j) in ids.iter().enumerate() {
        out.data[r * c + j] = g.data[r];
    }
    Ok(out)
}

fn ids_shape(x_shape: &[usize]) -> Vec<usize> {
    x_shape[..x_shape.len().saturating_sub(1)].to_vec()
}

// ------------------------------------------------------------------------------------------
// Convolution and pooling
// ------------------------------------------------------------------------------------------

/// The sliding-window geometry of a conv or pool over `x [N, C, H, W]`.
#[derive(Clone, Copy)]
struct Window {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    oh: usize,
    ow: usize,
}

impl Window {
    fn new(
        x_shape: &[usize],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        what: &str,
    ) -> R<Window> {
        if x_shape.len() != 4 {
            return Err(format!(
                "{what} needs an input of rank 4 [N, C, H, W], found shape {x_shape:?}"
            ));
        }
        let mut out = [0; 2];
        for i in 0..2 {
            let axis = if i == 0 { "height" } else { "width" };
            if stride[i] == 0 {
                return Err(format!("{what} stride must be at least 1"));
            }
            if kernel[i] == 0 {
                return Err(format!("{what} kernel {axis} must be at least 1"));
            }
            let padded = padding[i]
                .checked_mul(2)
                .and_then(|p| p.checked_add(x_shape[2 + i]))
                .ok_or_else(|| format!("{what} padding {} is too large", padding[i]))?;
            if padded < kernel[i] {
                return Err(format!(
                    "{what} output {axis} would be below 1: input {axis} {} with padding {} is smaller than the kernel {}",
                    x_shape[2 + i],
                    padding[i],
                    kernel[i]
                ));
            }
            out[i] = (padded - kernel[i]) / stride[i] + 1;
        }
        Ok(Window {
            n: x_shape[0],
            c: x_shape[1],
            h: x_shape[2],
            w: x_shape[3],
            kh: kernel[0],
            kw: kernel[1],
            sh: stride[0],
            sw: stride[1],
            ph: padding[0],
            pw: padding[1],
            oh: out[0],
            ow: out[1],
        })
    }

    /// The input position under kernel offset `(ky, kx)` of output `(oy, ox)`, or None when
    /// it falls in the padding.
    fn input_at(&self, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
        let iy = (oy * self.sh + ky).checked_sub(self.ph)?;
        let ix = (ox * self.sw + kx).checked_sub(self.pw)?;
        (iy < self.h && ix < self.w).then_some((iy, ix))
    }

    /// Flat position of `x[n, c, iy, ix]` in an `[N, C, H, W]` array.
    fn x_at(&self, n: usize, c: usize, iy: usize, ix: usize) -> usize {
        ((n * self.c + c) * self.h + iy) * self.w + ix
    }

    /// Flat position of `out[n, c, oy, ox]` in an `[N, C', OH, OW]` array with `cs` channels.
    fn out_at(&self, n: usize, c: usize, cs: usize, oy: usize, ox: usize) -> usize {
        ((n * cs + c) * self.oh + oy) * self.ow + ox
    }

    fn out_shape(&self, channels: usize) -> Vec<usize> {
        vec![self.n, channels, self.oh, self.ow]
    }
}

/// The geometry of a convolution of `x_shape` with weight `w [O, C, KH, KW]`.
fn conv_window(
    x_shape: &[usize],
    w: &Array,
    stride: [usize; 2],
    padding: [usize; 2],
    what: &str,
) -> R<Window> {
    need_rank(w, 4, &format!("{what} weight [O, C, KH, KW]"))?;
    let win = Window::new(x_shape, [w.shape[2], w.shape[3]], stride, padding, what)?;
    if w.shape[1] != win.c {
        return Err(format!(
            "{what}: the weight expects {} input channels, the input has {}",
            w.shape[1], win.c
        ));
    }
    Ok(win)
}

fn check_window_grad(g: &Array, expected: Vec<usize>, what: &str) -> R<()> {
    if g.shape != expected {
        return Err(format!(
            "{what}: the output gradient should have shape {expected:?}, found {:?}",
            g.shape
        ));
    }
    Ok(())
}

/// `out[n, o, oy, ox] = sum_{c, ky, kx} x[n, c, oy*s + ky - p, ox*s + kx - p] * w[o, c, ky, kx]`.
fn conv2d(x: &Array, w: &Array, stride: [usize; 2], padding: [usize; 2]) -> R<Array> {
    let win = conv_window(&x.shape, w, stride, padding, "conv2d")?;
    let o_ch = w.shape[0];
    let shape = win.out_shape(o_ch);
    let mut data = vec![0.0; numel(&shape)?];
    for n in 0..win.n {
        for o in 0..o_ch {
            for oy in 0..win.oh {
                for ox in 0..win.ow {
                    let mut s = 0.0;
                    for c in 0..win.c {
                        for ky in 0..win.kh {
                            for kx in 0..win.kw {
                                if let Some((iy, ix)) = win.input_at(oy, ox, ky, kx) {
                                    s += x.data[win.x_at(n, c, iy, ix)]
                                        * w.data[((o * win.c + c) * win.kh + ky) * win.kw + kx];
                                }
                            }
                        }
                    }
                    data[win.out_at(n, o, o_ch, oy, ox)] = s;
                }
            }
        }
    }
    Ok(Array { shape, data })
}

/// The gradient of conv2d with respect to its input (`x_like` gives the input's shape) or its
/// weight (`x` is then the input's value); both visit the same (output, kernel) pairs as
/// `conv2d` and scatter instead of gather.
fn conv2d_grad(
    x: &Array,
    w: &Array,
    g: &Array,
    stride: [usize; 2],
    padding: [usize; 2],
    wrt_input: bool,
) -> R<Array> {
    let what = if wrt_input {
        "conv2d_grad_input"
    } else {
        "conv2d_grad_weight"
    };
    let win = conv_window(&x.shape, w, stride, padding, what)?;
    let o_ch = w.shape[0];
    check_window_grad(g, win.out_shape(o_ch), what)?;
    let mut out = if wrt_input {
        Array::zeros(x.shape.clone())
    } else {
        Array::zeros(w.shape.clone())
    };
    for n in 0..win.n {
        for o in 0..o_ch {
            for oy in 0..win.oh {
                for ox in 0..win.ow {
                    let gv = g.data[win.out_at(n, o, o_ch, oy, ox)];
                    for c in 0..win.c {
                        for ky in 0..win.kh {
                            for kx in 0..win.kw {
                                if let Some((iy, ix)) = win.input_at(oy, ox, ky, kx) {
                                    let xi = win.x_at(n, c, iy, ix);
                                    let wi = ((o * win.c + c) * win.kh + ky) * win.kw + kx;
                                    if wrt_input {
                                        out.data[xi] += gv * w.data[wi];
                                    } else {
                                        out.data[wi] += gv * x.data[xi];
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The flat input position of the first maximum in window `(n, c, oy, ox)` (padding counts as
/// -inf, so it never wins), or None for a window that lies entirely in the padding.
fn pool_argmax(x: &Array, win: &Window, n: usize, c: usize, oy: usize, ox: usize) -> Option<usize> {
    let mut best: Option<usize> = None;
    for ky in 0..win.kh {
        for kx in 0..win.kw {
            if let Some((iy, ix)) = win.input_at(oy, ox, ky, kx) {
                let i = win.x_at(n, c, iy, ix);
                match best {
                    Some(b) if !beats(x.data[i], x.data[b]) => {}
                    _ => best = Some(i),
                }
            }
        }
    }
    best
}

fn max_pool2d(x: &Array, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> R<Array> {
    let win = Window::new(&x.shape, kernel, stride, padding, "max_pool2d")?;
    let shape = win.out_shape(win.c);
    let mut data = vec![0.0; numel(&shape)?];
    for n in 0..win.n {
        for c in 0..win.c {
            for oy in 0..win.oh {
                for ox in 0..win.ow {
                    data[win.out_at(n, c, win.c, oy, ox)] = match pool_argmax(x, &win, n, c, oy, ox)
                    {
                        Some(i) => x.data[i],
                        None => f64::NEG_INFINITY,
                    };
                }
            }
        }
    }
    Ok(Array { shape, data })
}

/// Each window's gradient goes to its first maximum; overlapping windows accumulate.
fn max_pool2d_grad(
    x: &Array,
    g: &Array,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> R<Array> {
    let win = Window::new(&x.shape, kernel, stride, padding, "max_pool2d_grad")?;
    check_window_grad(g, win.out_shape(win.c), "max_pool2d_grad")?;
    let mut out = Array::zeros(x.shape.clone());
    for n in 0..win.n {
        for c in 0..win.c {
            for oy in 0..win.oh {
                for ox in 0..win.ow {
                    if let Some(i) = pool_argmax(x, &win, n, c, oy, ox) {
                        out.data[i] += g.data[win.out_at(n, c, win.c, oy, ox)];
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Average with `count_include_pad = true`: padded positions count as zeros, so every window
/// divides by `KH * KW` (without ceil mode no window reaches past the padding).
fn avg_pool2d(x: &Array, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> R<Array> {
    let win = Window::new(&x.shape, kernel, stride, padding, "avg_pool2d")?;
    let shape = win.out_shape(win.c);
    let count = (win.kh * win.kw) as f64;
    let mut data = vec![0.0; numel(&shape)?];
    for n in 0..win.n {
        for c in 0..win.c {
            for oy in 0..win.oh {
                for ox in 0..win.ow {
                    let mut s = 0.0;
                    for ky in 0..win.kh {
                        for kx in 0..win.kw {
                            if let Some((iy, ix)) = win.input_at(oy, ox, ky, kx) {
                                s += x.data[win.x_at(n, c, iy, ix)];
                            }
                        }
                    }
                    data[win.out_at(n, c, win.c, oy, ox)] = s / count;
                }
            }
        }
    }
    Ok(Array { shape, data })
}

fn avg_pool2d_grad(
    x_like: &Array,
    g: &Array,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> R<Array> {
    let win = Window::new(&x_like.shape, kernel, stride, padding, "avg_pool2d_grad")?;
    check_window_grad(g, win.out_shape(win.c), "avg_pool2d_grad")?;
    let count = (win.kh * win.kw) as f64;
    let mut out = Array::zeros(x_like.shape.clone());
    for n in 0..win.n {
        for c in 0..win.c {
            for oy in 0..win.oh {
                for ox in 0..win.ow {
                    let gv = g.data[win.out_at(n, c, win.c, oy, ox)] / count;
                    for ky in 0..win.kh {
                        for kx in 0..win.kw {
                            if let Some((iy, ix)) = win.input_at(oy, ox, ky, kx) {
                                out.data[win.x_at(n, c, iy, ix)] += gv;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Embedding
// ------------------------------------------------------------------------------------------

/// The ids as row indices of a `[V, D]` table; returns (V, D, ids).
fn embedding_args(table_shape: &[usize], ids: &Array, what: &str) -> R<(usize, usize, Vec<usize>)> {
    if table_shape.len() != 2 {
        return Err(format!(
            "{what} needs a rank-2 table [V, D], found shape {table_shape:?}"
        ));
    }
    let (v, d) = (table_shape[0], table_shape[1]);
    let ids = ids
        .data
        .iter()
        .enumerate()
        .map(|(i, &x)| index_value(x, v, &format!("{what} id"), i))
        .collect::<R<Vec<_>>>()?;
    Ok((v, d, ids))
}

/// `out[i.., :] = table[ids[i..], :]`.
fn embedding(table: &Array, ids: &Array) -> R<Array> {
    let (_, d, rows) = embedding_args(&table.shape, ids, "embedding")?;
    let mut shape = ids.shape.clone();
    shape.push(d);
    let mut data = Vec::with_capacity(numel(&shape)?);
    for &r in &rows {
        data.extend_from_slice(&table.data[r * d..(r + 1) * d]);
    }
    Ok(Array { shape, data })
}

/// Rows of `g` added into a zero table at `ids` (repeated ids accumulate).
fn embedding_grad(g: &Array, ids: &Array, table_like: &Array) -> R<Array> {
    let (_, d, rows) = embedding_args(&table_like.shape, ids, "embedding_grad")?;
    let mut expected = ids.shape.clone();
    expected.push(d);
    if g.shape != expected {
        return Err(format!(
            "embedding_grad: the output gradient should have shape {expected:?}, found {:?}",
            g.shape
        ));
    }
    let mut out = Array::zeros(table_like.shape.clone());
    for (i, &r) in rows.iter().enumerate() {
        for j in 0..d {
            out.data[r * d + j] += g.data[i * d + j];
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Layout
// ------------------------------------------------------------------------------------------

fn reshape(x: &Array, target: &[Dim], env: &HashMap<String, i64>) -> R<Array> {
    let mut shape = Vec::with_capacity(target.len());
    for d in target {
        let v = d.eval(env).ok_or_else(|| {
            format!("reshape target dimension `{d}` mentions a symbol or parameter with no value")
        })?;
        let v = usize::try_from(v).map_err(|_| {
            format!("reshape target dimension `{d}` evaluates to {v}, which is negative")
        })?;
        shape.push(v);
    }
    if numel(&shape)? != x.data.len() {
        return Err(format!(
            "reshape from {:?} to {shape:?} changes the number of elements",
            x.shape
        ));
    }
    Ok(Array {
        shape,
        data: x.data.clone(),
    })
}

/// `out[i_0, .., i_r] = x[j]` where `j[perm[k]] = i_k`: output axis k is input axis perm[k].
fn permute(x: &Array, perm: &[usize]) -> R<Array> {
    let r = x.shape.len();
    let mut seen = vec![false; r];
    if perm.len() != r
        || !perm
            .iter()
            .all(|&p| p < r && !std::mem::replace(&mut seen[p], true))
    {
        return Err(format!(
            "permutation {perm:?} does not reorder the {r} axes of {:?}",
            x.shape
        ));
    }
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let mut out_idx = vec![0; r];
    let mut in_idx = vec![0; r];
    let mut data = Vec::with_capacity(x.data.len());
    for flat in 0..x.data.len() {
        unravel(flat, &shape, &mut out_idx);
        for k in 0..r {
            in_idx[perm[k]] = out_idx[k];
        }
        data.push(x.data[ravel(&in_idx, &x.shape)]);
    }
    Ok(Array { shape, data })
}

fn concat(parts: &[&Array], axis: usize) -> R<Array> {
    let first = parts.first().ok_or("concat needs at least one array")?;
    need_axis(axis, first.shape.len(), "concat")?;
    let mut total = 0usize;
    for (i, p) in parts.iter().enumerate() {
        let agrees = p.shape.len() == first.shape.len()
            && p.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(k, (a, b))| k == axis || a == b);
        if !agrees {
            return Err(format!(
                "concat argument {i} has shape {:?}, which differs from {:?} outside the concat axis {axis}",
                p.shape, first.shape
            ));
        }
        total = total
            .checked_add(p.shape[axis])
            .ok_or("concat result is too large")?;
    }
    let mut shape = first.shape.clone();
    shape[axis] = total;
    let (outer, _, inner) = split_at_axis(&first.shape, axis)?;
    let mut data = Vec::with_capacity(numel(&shape)?);
    for o in 0..outer {
        for p in parts {
            let chunk = p.shape[axis] * inner;
            data.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(Array { shape, data })
}

fn narrow(x: &Array, axis: usize, start: usize, len: usize) -> R<Array> {
    need_axis(axis, x.shape.len(), "narrow")?;
    let (outer, n, inner) = split_at_axis(&x.shape, axis)?;
    if start.checked_add(len).is_none_or(|end| end > n) {
        return Err(format!(
            "narrow {start}..{start}+{len} is out of range for dimension {axis} of size {n}"
        ));
    }
    let mut shape = x.shape.clone();
    shape[axis] = len;
    let mut data = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        data.extend_from_slice(&x.data[(o * n + start) * inner..(o * n + start + len) * inner]);
    }
    Ok(Array { shape, data })
}

/// The inverse of narrow: `g` placed at `start..` along `axis` of a zero array shaped like
/// `full_like`.
fn pad_narrow(g: &Array, full_like: &Array, axis: usize, start: usize) -> R<Array> {
    need_axis(axis, full_like.shape.len(), "pad_narrow")?;
    let (outer, n, inner) = split_at_axis(&full_like.shape, axis)?;
    let fits = g.shape.len() == full_like.shape.len()
        && g.shape
            .iter()
            .zip(&full_like.shape)
            .enumerate()
            .all(|(k, (a, b))| k == axis || a == b)
        && start.checked_add(g.shape[axis]).is_some_and(|end| end <= n);
    if !fits {
        return Err(format!(
            "pad_narrow cannot place a gradient of shape {:?} at {start} along axis {axis} of shape {:?}",
            g.shape, full_like.shape
        ));
    }
    let len = g.shape[axis];
    let mut out = Array::zeros(full_like.shape.clone());
    for o in 0..outer {
        out.data[(o * n + start) * inner..(o * n + start + len) * inner]
            .copy_from_slice(&g.data[o * len * inner..(o + 1) * len * inner]);
    }
    Ok(out)
}

fn broadcast_to(x: &Array, like: &Array) -> R<Array> {
    let shape = broadcast_shape(&x.shape, &like.shape)?;
    if shape != like.shape {
        return Err(format!(
            "broadcast_to cannot broadcast {:?} to {:?}",
            x.shape, like.shape
        ));
    }
    binary(x, like, |a, _| a)
}

/// `g` summed over the axes that broadcasting `like` up to `g`'s shape would repeat.
fn sum_to(g: &Array, like: &Array) -> R<Array> {
    if broadcast_shape(&like.shape, &g.shape).ok().as_deref() != Some(&g.shape[..]) {
        return Err(format!(
            "sum_to cannot sum {:?} down to {:?}: the latter does not broadcast to the former",
            g.shape, like.shape
        ));
    }
    let mut out = Array::zeros(like.shape.clone());
    let mut idx = vec![0; g.shape.len()];
    for (flat, &v) in g.data.iter().enumerate() {
        unravel(flat, &g.shape, &mut idx);
        out.data[broadcast_source(&idx, &like.shape)] += v;
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Entry points
// ------------------------------------------------------------------------------------------

/// Evaluate one op on its argument arrays. Errors (bad label, shapes that do not fit) are
/// Strings, never panics.
pub fn eval(op: &Op, args: &[&Array], ctx: &RefCtx) -> Result<Array, String> {
    let def = op.def();
    if def.arity == usize::MAX {
        if args.is_empty() {
            return Err(format!("{} needs at least one argument", def.name));
        }
    } else if args.len() != def.arity {
        return Err(format!(
            "{} takes {} argument(s), found {}",
            def.name,
            def.arity,
            args.len()
        ));
    }
    for (i, a) in args.iter().enumerate() {
        if numel(&a.shape)? != a.data.len() {
            return Err(format!(
                "{} argument {i}: shape {:?} does not match its {} elements",
                def.name,
                a.shape,
                a.data.len()
            ));
        }
    }
    let x = |i: usize| args[i];
    match op {
        Op::Input { .. } | Op::Param { .. } => {
            Err(format!("{} is a leaf; `run` supplies its value", def.name))
        }
        Op::Const { value } => Ok(Array::scalar(*value)),

        Op::StopGradient => Ok(x(0).clone()),
        Op::Autocast => Ok(unary(x(0), |v| round_to(v, ctx.autocast.precision))),
        Op::AutocastGrad => {
            let scale = ctx.autocast.loss_scale as f64;
            Ok(unary(x(0), |g| {
                round_to(g * scale, ctx.autocast.precision) / scale
            }))
        }
        Op::Neg => Ok(unary(x(0), |v| -v)),
        Op::Relu => Ok(unary(x(0), relu)),
        Op::Gelu => Ok(unary(x(0), gelu)),
        Op::GeluTanh => Ok(unary(x(0), gelu_tanh)),
        Op::Tanh => Ok(unary(x(0), f64::tanh)),
        Op::Sin => Ok(unary(x(0), f64::sin)),
        Op::Cos => Ok(unary(x(0), f64::cos)),
        Op::Sigmoid => Ok(unary(x(0), sigmoid)),
        Op::Exp => Ok(unary(x(0), f64::exp)),
        Op::Log => Ok(unary(x(0), f64::ln)),
        Op::Sqrt => Ok(unary(x(0), f64::sqrt)),
        Op::PowScalar { exponent } => Ok(unary(x(0), |v| v.powf(*exponent))),
        Op::Add => binary(x(0), x(1), |a, b| a + b),
        Op::Sub => binary(x(0), x(1), |a, b| a - b),
        Op::Mul => binary(x(0), x(1), |a, b| a * b),
        Op::Div => binary(x(0), x(1), |a, b| a / b),
        Op::Maximum => binary(x(0), x(1), |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }),
        Op::Minimum => binary(x(0), x(1), |a, b| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }),
        Op::Compare { cmp } => binary(x(0), x(1), |a, b| f64::from(u8::from(cmp.holds(a, b)))),
        Op::Select => {
            let full = binary(x(0), &binary(x(1), x(2), |_, _| 0.0)?, |_, _| 0.0)?;
            let shape = full.shape.clone();
            let cond = broadcast_to(x(0), &full)?;
            let a = broadcast_to(x(1), &full)?;
            let b = broadcast_to(x(2), &full)?;
            let data = (0..cond.data.len())
                .map(|i| {
                    if cond.data[i] != 0.0 {
                        a.data[i]
                    } else {
                        b.data[i]
                    }
                })
                .collect();
            Ok(Array { shape, data })
        }

        Op::Sum { axes, keepdim } => sum(x(0), axes, *keepdim, "sum"),
        Op::Mean { axes, keepdim } => {
            let red = Reduction::new(&x(0).shape, axes, *keepdim, "mean")?;
            let s = sum(x(0), axes, *keepdim, "mean")?;
            Ok(unary(&s, |v| v / red.count as f64))
        }
        Op::Max { axes, keepdim } => {
            let red = Reduction::new(&x(0).shape, axes, *keepdim, "max")?;
            let best = argmax_groups(x(0), &red, "max")?;
            Ok(Array {
                shape: red.out,
                data: best.iter().map(|&i| x(0).data[i]).collect(),
            })
        }

        Op::MatMul => matmul(x(0), x(1)),
        Op::Attention { causal } => attention::attention(x(0), x(1), x(2), *causal),
        Op::AttentionGrad { causal } => attention::attention_grad(x(0), x(1), x(2), x(3), *causal),
        Op::Conv2d { stride, padding } => conv2d(x(0), x(1), *stride, *padding),
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        } => max_pool2d(x(0), *kernel, *stride, *padding),
        Op::AvgPool2d {
            kernel,
            stride,
            padding,
        } => avg_pool2d(x(0), *kernel, *stride, *padding),
        Op::Embedding => embedding(x(0), x(1)),
        Op::Pick => pick(x(0), x(1)),
        Op::ArgMax { axis } => argmax(x(0), *axis),
        Op::TopK { k } => top_k::top_k(x(0), *k, false),
        Op::TopKIndices { k } => top_k::top_k(x(0), *k, true),
        Op::TopKGrad { k } => top_k::top_k_grad(x(0), x(1), *k),
        Op::Positions { axis } => {
            let Some(&n) = x(0).shape.get(*axis) else {
                return Err(format!(
                    "positions axis {axis} is out of range for rank {}",
                    x(0).shape.len()
                ));
            };
            Ok(Array {
                shape: vec![n],
                data: (0..n).map(|i| i as f64).collect(),
            })
        }
        Op::Iota { axis } => {
            let shape = &x(0).shape;
            let Some(&n) = shape.get(*axis) else {
                return Err(format!(
                    "iota axis {axis} is out of range for rank {}",
                    shape.len()
                ));
            };
            let mut out = vec![1; shape.len()];
            out[*axis] = n;
            Ok(Array {
                shape: out,
                data: (0..n).map(|i| i as f64).collect(),
            })
        }
        Op::DropoutMask { p } => {
            if !(0.0..1.0).contains(p) {
                return Err(format!("dropout probability must be in [0, 1), found {p}"));
            }
            if !ctx.train {
                return Ok(unary(x(0), |_| 1.0));
            }
            let data = (0..x(0).data.len())
                .map(|i| dropout_mask_value(ctx.seed, i as u64, *p))
                .collect();
            Ok(Array {
                shape: x(0).shape.clone(),
                data,
            })
        }

        Op::Reshape { shape } => reshape(x(0), shape, ctx.env),
        Op::Permute { perm } => permute(x(0), perm),
        Op::Concat { axis } => concat(args, *axis),
        Op::Narrow { axis, start, len } => narrow(x(0), *axis, *start, *len),
        Op::BroadcastTo => broadcast_to(x(0), x(1)),

        Op::SumTo => sum_to(x(0), x(1)),
        Op::ReluGrad => zip_same(
            x(0),
            x(1),
            "relu_grad",
            |v, g| if v > 0.0 { g } else { 0.0 },
        ),
        Op::GeluGrad => zip_same(x(0), x(1), "gelu_grad", |v, g| g * gelu_grad(v)),
        Op::GeluTanhGrad => zip_same(x(0), x(1), "gelu_tanh_grad", |v, g| g * gelu_tanh_grad(v)),
        Op::MeanGrad { axes, keepdim } => {
            let red = Reduction::new(&x(0).shape, axes, *keepdim, "mean_grad")?;
            red.check_grad(x(1), "mean_grad")?;
            let mut out = Array::zeros(x(0).shape.clone());
            let mut idx = vec![0; out.shape.len()];
            for flat in 0..out.data.len() {
                unravel(flat, &out.shape, &mut idx);
                out.data[flat] = x(1).data[red.group(&idx)] / red.count as f64;
            }
            Ok(out)
        }
        Op::MaxGrad { axes, keepdim } => {
            let red = Reduction::new(&x(0).shape, axes, *keepdim, "max_grad")?;
            red.check_grad(x(1), "max_grad")?;
            let best = argmax_groups(x(0), &red, "max_grad")?;
            let mut out = Array::zeros(x(0).shape.clone());
            for (group, &i) in best.iter().enumerate() {
                out.data[i] += x(1).data[group];
            }
            Ok(out)
        }
        Op::PickGrad => pick_grad(x(0), x(1), x(2)),
        Op::Conv2dGradInput { stride, padding } => {
            conv2d_grad(x(2), x(1), x(0), *stride, *padding, true)
        }
        Op::Conv2dGradWeight { stride, padding } => {
            conv2d_grad(x(0), x(2), x(1), *stride, *padding, false)
        }
        Op::MaxPool2dGrad {
            kernel,
            stride,
            padding,
        } => max_pool2d_grad(x(0), x(1), *kernel, *stride, *padding),
        Op::AvgPool2dGrad {
            kernel,
            stride,
            padding,
        } => avg_pool2d_grad(x(0), x(1), *kernel, *stride, *padding),
        Op::PadNarrow { axis, start } => pad_narrow(x(0), x(1), *axis, *start),
        Op::EmbeddingGrad => embedding_grad(x(0), x(1), x(2)),
        Op::ConcatGrad { axis, index } => {
            let parts = args.get(1..).unwrap_or_default();
            let part = parts
                .get(*index)
                .ok_or_else(|| format!("concat_grad: no part {index} among {}", parts.len()))?;
            need_axis(*axis, part.shape.len(), "concat_grad")?;
            let start = parts[..*index]
                .iter()
                .map(|p| p.shape.get(*axis).copied().unwrap_or(0))
                .sum();
            narrow(x(0), *axis, start, part.shape[*axis])
        }
    }
}

/// The stream of dropout seeds of one graph call: splitmix64, the generator behind
/// `rtx_core::Rng`, so `run` with seed `s` draws the masks of `Ctx::train(s)`.
struct SeedStream(u64);

impl SeedStream {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Evaluate every node of `graph` in order; Input nodes take `inputs[index]`, Param nodes
/// `params(name)`. Returns all node values.
///
/// Symbols and generic parameters that appear as a whole dimension of a leaf (`[B, 784]`) and
/// have no value in `ctx.env` are bound from the leaf's array, as the executor binds them when
/// a graph is entered. Every value, leaf or computed, is then checked against its node's
/// declared shape wherever that shape can be evaluated, so a shape rule that disagrees with
/// the reference is reported rather than silently trusted.
pub fn run(
    graph: &Graph,
    inputs: &[Array],
    params: &dyn Fn(&str) -> Option<Array>,
    ctx: &RefCtx,
) -> Result<Vec<Array>, String> {
    let mut env = ctx.env.clone();
    let mut values: Vec<Array> = Vec::with_capacity(graph.len());
    let mut seeds = SeedStream(ctx.seed);
    for (id, node) in graph.nodes.iter().enumerate() {
        let is_leaf = matches!(node.op, Op::Input { .. } | Op::Param { .. });
        let value = match &node.op {
            Op::Input { index, name, .. } => inputs.get(*index).cloned().ok_or_else(|| {
                format!(
                    "node %{id}: input {index} `{name}` was not supplied ({} inputs given)",
                    inputs.len()
                )
            })?,
            Op::Param { name, .. } => params(name)
                .ok_or_else(|| format!("node %{id}: no value for parameter `{name}`"))?,
            op => {
                let mut args = Vec::with_capacity(node.args.len());
                for &a in &node.args {
                    if a >= id {
                        return Err(format!(
                            "node %{id} ({}) uses %{a}, which is not computed before it",
                            op.name()
                        ));
                    }
                    args.push(&values[a]);
                }
                // Each dropout node draws its own seed, in node order, as the runtime's
                // `Ctx::next_seed` does, so a train-mode graph is reproducible here.
                let seed = if matches!(op, Op::DropoutMask { .. }) && ctx.train {
                    seeds.next()
                } else {
                    ctx.seed
                };
                let local = RefCtx {
                    env: &env,
                    train: ctx.train,
                    autocast: ctx.autocast,
                    seed,
                };
                eval(op, &args, &local).map_err(|e| format!("node %{id} ({}): {e}", op.name()))?
            }
        };
        if is_leaf {
            if numel(&value.shape)? != value.data.len() {
                return Err(format!(
                    "node %{id}: shape {:?} does not match its {} elements",
                    value.shape,
                    value.data.len()
                ));
            }
            if node.shape.len() == value.shape.len() {
                bind_symbols(&node.shape, &value.shape, &mut env);
            }
            if node.dtype == DType::I64
                && !value.data.iter().all(|v| v.is_finite() && v.fract() == 0.0)
            {
                return Err(format!(
                    "node %{id}: an integer tensor holds a value that is not an integer"
                ));
            }
        }
        check_declared_shape(&node.shape, &value.shape, &env)
            .map_err(|e| format!("node %{id} ({}): {e}", node.op.name()))?;
        values.push(value);
    }
    Ok(values)
}

/// Binds each dimension that is a lone symbol or parameter without a value to the actual size.
fn bind_symbols(declared: &[Dim], actual: &[usize], env: &mut HashMap<String, i64>) {
    for (d, &n) in declared.iter().zip(actual) {
        if let Some(Atom::Sym(name) | Atom::Param(name)) = d.as_single_atom()
            && let (false, Ok(n)) = (env.contains_key(name), i64::try_from(n))
        {
            env.insert(name.clone(), n);
        }
    }
}

/// Compares a value's shape with its node's declared shape; dimensions that cannot be
/// evaluated (an unbound symbol) are not checked.
fn check_declared_shape(declared: &[Dim], actual: &[usize], env: &HashMap<String, i64>) -> R<()> {
    let fits = declared.len() == actual.len()
        && declared
            .iter()
            .zip(actual)
            .all(|(d, &n)| d.eval(env).is_none_or(|v| i64::try_from(n) == Ok(v)));
    if !fits {
        return Err(format!(
            "the shape rule gives {} but the value has shape {actual:?}",
            crate::infer::fmt_shape(declared)
        ));
    }
    Ok(())
}
