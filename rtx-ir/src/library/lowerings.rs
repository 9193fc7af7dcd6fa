//! The lowerings of the library ops longer than one core op: each builds its composition
//! through `Emit`, reading its arguments from `Args` by position.

// One file: the lowering helpers every library op composes (broadcasting, autocast
// rounding, products) are shared across the table in `mod.rs`; splitting them would scatter
// one op's lowering.

use super::{Args, Emit};
use crate::graph::NodeId;
use crate::infer::ShapeError;
use crate::op::{Cmp, DType, Op, Shape};

pub(super) fn mse(e: &mut dyn Emit, args: &Args) -> Result<NodeId, ShapeError> {
    let (a, b) = (args.tensor(0)?, args.tensor(1)?);
    // Exactly one shape, unlike `sub`: broadcasting a [B, 1] prediction against [B] targets
    // is the classic silent bug (PyTorch only warns).
    let (sa, sb) = (e.shape(a).clone(), e.shape(b).clone());
    if !e.same_shape(&sa, &sb) {
        return Err(ShapeError::mismatch(1, sa, &sb));
    }
    let diff = e.op(Op::Sub, &[a, b])?;
    let squared = e.op(Op::Mul, &[diff, diff])?;
    mean_all(e, squared)
}

pub(super) fn cross_entropy(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (logits, labels) = (a.tensor(0)?, a.tensor(1)?);
    let rank = e.shape(logits).len();
    if rank == 0 {
        return Err(ShapeError::invalid(
            0,
            "cross_entropy needs logits with a class axis ([N, C]), found a scalar",
        ));
    }
    // log_softmax is one row kernel forward and backward; the gradient that reaches the
    // logits is softmax - onehot, scaled, without a rule of its own.
    let log_probs = softmax(e, logits, rank - 1, true)?;
    let picked = e
        .op(Op::Pick, &[log_probs, labels])
        .map_err(|err| err.with_help("labels hold one class index per row of the logits"))?;
    let mean = mean_all(e, picked)?;
    e.op(Op::Neg, &[mean])
}

/// The mean over every axis, a scalar.
fn mean_all(e: &mut dyn Emit, x: NodeId) -> Result<NodeId, ShapeError> {
    let rank = e.shape(x).len();
    e.op(
        Op::Mean {
            axes: (0..rank).collect(),
            keepdim: false,
        },
        &[x],
    )
}

pub(super) fn silu(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let t = [a.tensor(0)?];
    let s = e.op(Op::Sigmoid, &[t[0]])?;
    e.op(Op::Mul, &[t[0], s])
}

pub(super) fn abs(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    magnitude(e, a.tensor(0)?)
}

fn magnitude(e: &mut dyn Emit, x: NodeId) -> Result<NodeId, ShapeError> {
    let t = [x];
    // maximum(x, -x): at 0 the tie splits the gradient, +1/2 - 1/2 = 0, like PyTorch.
    let n = e.op(Op::Neg, &[t[0]])?;
    e.op(Op::Maximum, &[t[0], n])
}

pub(super) fn clamp(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (t, n) = ([a.tensor(0)?], [a.number(1)?, a.number(2)?]);
    // Selects rather than maximum/minimum, so a value on a bound keeps its full gradient.
    let (lo, hi) = (e.constant(n[0]), e.constant(n[1]));
    let below = e.op(Op::Compare { cmp: Cmp::Lt }, &[t[0], lo])?;
    let above = e.op(Op::Compare { cmp: Cmp::Gt }, &[t[0], hi])?;
    let upper = e.op(Op::Select, &[above, hi, t[0]])?;
    e.op(Op::Select, &[below, lo, upper])
}

pub(super) fn softplus(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (t, n) = ([a.tensor(0)?], [a.number(1)?]);
    // max(z, 0) + log(1 + exp(-|z|)) with z = beta x: never overflows, and its gradient at 0
    // is 1/2 (the tie of max splits it), sigmoid(0) as it should be.
    let beta = e.constant(n[0]);
    let z = e.op(Op::Mul, &[t[0], beta])?;
    let zero = e.constant(0.0);
    let pos = e.op(Op::Maximum, &[z, zero])?;
    let mag = magnitude(e, z)?;
    let neg = e.op(Op::Neg, &[mag])?;
    let ex = e.op(Op::Exp, &[neg])?;
    let one = e.constant(1.0);
    let onep = e.op(Op::Add, &[one, ex])?;
    let lg = e.op(Op::Log, &[onep])?;
    let sp = e.op(Op::Add, &[pos, lg])?;
    e.op(Op::Div, &[sp, beta])
}

pub(super) fn leaky_relu(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (t, n) = ([a.tensor(0)?], [a.number(1)?]);
    let (zero, slope) = (e.constant(0.0), e.constant(n[0]));
    let pos = e.op(Op::Compare { cmp: Cmp::Gt }, &[t[0], zero])?;
    let scaled = e.op(Op::Mul, &[t[0], slope])?;
    e.op(Op::Select, &[pos, t[0], scaled])
}

pub(super) fn min_all(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let t = [a.tensor(0)?];
    let rank = e.shape(t[0]).len();
    let n = e.op(Op::Neg, &[t[0]])?;
    let m = e.op(
        Op::Max {
            axes: (0..rank).collect(),
            keepdim: false,
        },
        &[n],
    )?;
    e.op(Op::Neg, &[m])
}

/// `softmax(x, axis)`, or `log_softmax(x, axis)` when `log`: the row max is subtracted first
/// (so `exp` cannot overflow) through `StopGradient`, as the shift cancels in the result and
/// its gradient is exactly zero. Over the last axis the planner fuses the whole composition,
/// forward and backward, into one row kernel. The caller (the macro, which parses the axis)
/// guarantees `axis < rank`.
pub fn softmax(e: &mut dyn Emit, x: NodeId, axis: usize, log: bool) -> Result<NodeId, ShapeError> {
    let keep = |op: fn(Vec<usize>, bool) -> Op| op(vec![axis], true);
    let max = e.op(keep(|axes, keepdim| Op::Max { axes, keepdim }), &[x])?;
    let shift = e.op(Op::StopGradient, &[max])?;
    let shifted = e.op(Op::Sub, &[x, shift])?;
    let exps = e.op(Op::Exp, &[shifted])?;
    let total = e.op(keep(|axes, keepdim| Op::Sum { axes, keepdim }), &[exps])?;
    if log {
        let log_total = e.op(Op::Log, &[total])?;
        e.op(Op::Sub, &[shifted, log_total])
    } else {
        e.op(Op::Div, &[exps, total])
    }
}

pub(super) fn layer_norm(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (x, w, b) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
    let n = [a.number(3)?];
    let rank = per_feature(
        e,
        "layer_norm",
        "weight and bias have",
        x,
        &[(1, w), (2, b)],
    )?;
    let last = Op::Mean {
        axes: vec![rank - 1],
        keepdim: true,
    };
    let mean = e.op(last.clone(), &[x])?;
    let centered = e.op(Op::Sub, &[x, mean])?;
    let squared = e.op(Op::Mul, &[centered, centered])?;
    let var = e.op(last, &[squared])?;
    let eps = e.constant(n[0]);
    let shifted = e.op(Op::Add, &[var, eps])?;
    let std = e.op(Op::Sqrt, &[shifted])?;
    let normed = e.op(Op::Div, &[centered, std])?;
    let scaled = e.op(Op::Mul, &[normed, w])?;
    e.op(Op::Add, &[scaled, b])
}

/// The last axis's size as `[D]`, and a check that `weight` is exactly that (not something
/// that only broadcasts): what layer_norm and rms_norm scale by.
fn per_feature(
    e: &mut dyn Emit,
    op: &str,
    what: &str,
    x: NodeId,
    weights: &[(usize, NodeId)],
) -> Result<usize, ShapeError> {
    let rank = e.shape(x).len();
    if rank == 0 {
        return Err(ShapeError::invalid(
            0,
            format!("{op} normalizes over the last axis; a scalar has none"),
        ));
    }
    let features: Shape = vec![e.shape(x)[rank - 1].clone()];
    for &(arg, v) in weights {
        if e.shape(v) != &features {
            return Err(
                ShapeError::mismatch(arg, features, e.shape(v)).with_help(format!(
                    "{op}'s {what} one value per feature of the last axis"
                )),
            );
        }
    }
    Ok(rank)
}

pub(super) fn rms_norm(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (x, w) = (a.tensor(0)?, a.tensor(1)?);
    let eps = a.number(2)?;
    let rank = per_feature(e, "rms_norm", "weight has", x, &[(1, w)])?;
    let squared = e.op(Op::Mul, &[x, x])?;
    let mean = e.op(
        Op::Mean {
            axes: vec![rank - 1],
            keepdim: true,
        },
        &[squared],
    )?;
    let eps = e.constant(eps);
    let shifted = e.op(Op::Add, &[mean, eps])?;
    let rms = e.op(Op::Sqrt, &[shifted])?;
    let normed = e.op(Op::Div, &[x, rms])?;
    e.op(Op::Mul, &[normed, w])
}

/// `tril` (`lower`) or `triu` of x's last two axes, as PyTorch: positions compared through two
/// `Iota`s, which broadcast against x, and x kept where the comparison holds.
pub(super) fn triangle(e: &mut dyn Emit, a: &Args, lower: bool) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let diagonal = a.number(1)?;
    let rank = e.shape(x).len();
    if rank < 2 {
        let op = if lower { "tril" } else { "triu" };
        return Err(ShapeError::invalid(
            0,
            format!("{op} works on the last two axes; a tensor of rank {rank} has fewer"),
        ));
    }
    if diagonal.fract() != 0.0 {
        e.blame(1);
        return Err(ShapeError::invalid(
            1,
            format!("the diagonal is a whole number of places, found {diagonal}"),
        ));
    }
    let rows = e.op(Op::Iota { axis: rank - 2 }, &[x])?;
    let cols = e.op(Op::Iota { axis: rank - 1 }, &[x])?;
    let shift = e.constant(diagonal);
    let bound = e.op(Op::Add, &[rows, shift])?;
    let cmp = if lower { Cmp::Le } else { Cmp::Ge };
    let keep = e.op(Op::Compare { cmp }, &[cols, bound])?;
    let zero = e.constant(0.0);
    e.op(Op::Select, &[keep, x, zero])
}

pub(super) fn masked_fill(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (x, mask) = (a.tensor(0)?, a.tensor(1)?);
    let value = e.constant(a.number(2)?);
    // `where(mask, value, x)`, with x's shape: a mask that would widen x is an error.
    // Only the mask can fail to broadcast here (the value is a scalar).
    let filled = e
        .op(Op::Select, &[mask, value, x])
        .inspect_err(|_| e.blame(1))?;
    if e.shape(filled) != e.shape(x) {
        let (want, got) = (e.shape(x).clone(), e.shape(filled).clone());
        e.blame(1);
        return Err(ShapeError::mismatch(1, want, &got)
            .with_help("the mask broadcasts to x's shape; it cannot add dimensions to x"));
    }
    Ok(filled)
}

pub(super) fn dropout(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    // A mask per call: random ops are never merged, so two dropouts draw two masks.
    let mask = e
        .op(Op::DropoutMask { p: a.number(1)? }, &[x])
        .inspect_err(|_| e.blame(1))?;
    e.op(Op::Mul, &[x, mask])
}

pub(super) fn reduce(
    e: &mut dyn Emit,
    a: &Args,
    op: fn(Vec<usize>, bool) -> Op,
) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let mut axes = match a.axes(1)? {
        Some(axes) => axes.to_vec(),
        None => (0..e.shape(x).len()).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    e.op(op(axes, a.flag(2)?), &[x])
}

pub(super) fn pool(e: &mut dyn Emit, a: &Args, max: bool) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let k = a.size(1)?.unwrap_or(1);
    let (kernel, stride, padding) = (
        [k; 2],
        [a.size(2)?.unwrap_or(k); 2],
        [a.size(3)?.unwrap_or(0); 2],
    );
    let op = if max {
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        }
    } else {
        Op::AvgPool2d {
            kernel,
            stride,
            padding,
        }
    };
    e.op(op, &[x])
}

pub(super) fn reshape(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let shape = a.dims(1)?.clone();
    // A count mismatch is about the target dims the user wrote.
    e.op(Op::Reshape { shape }, &[a.tensor(0)?])
        .inspect_err(|_| e.blame(1))
}

pub(super) fn flatten(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let xs = e.shape(x).clone();
    let start = match a.axes(1)? {
        Some([start]) => *start,
        _ => 1.min(xs.len()),
    };
    let mut shape: Shape = xs[..start].to_vec();
    shape.push(
        xs[start..]
            .iter()
            .fold(crate::Dim::known(1), |acc, d| acc.mul(d)),
    );
    e.op(Op::Reshape { shape }, &[x])
}

pub(super) fn transpose(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let mut perm: Vec<usize> = (0..e.shape(x).len()).collect();
    perm.swap(a.axis(1)?, a.axis(2)?);
    e.op(Op::Permute { perm }, &[x])
}

pub(super) fn permute(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let perm = a.axes(1)?.unwrap_or_default().to_vec();
    e.op(Op::Permute { perm }, &[a.tensor(0)?])
        .inspect_err(|_| e.blame(1))
}

pub(super) fn rope(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let base = a.number(1)?;
    let xs = e.shape(x).clone();
    let rank = xs.len();
    if rank < 2 {
        return Err(ShapeError::invalid(
            0,
            format!("rope needs [.., T, D], found {}", crate::fmt_shape(&xs)),
        ));
    }
    let width = match xs[rank - 1].as_known() {
        Some(d) if d % 2 == 0 && d > 0 => d,
        _ => {
            return Err(ShapeError::invalid(
                0,
                format!(
                    "rope turns pairs of features, so the last dimension must be an even literal; found {} in {}",
                    xs[rank - 1],
                    crate::fmt_shape(&xs)
                ),
            )
            .with_help("use an even head size (split the width into heads first)"));
        }
    };
    if base.is_nan() || base <= 1.0 {
        e.blame(1);
        return Err(ShapeError::invalid(
            1,
            format!("rope's base must be above 1, found {base}"),
        ));
    }
    let half = width / 2;
    let part = |start| Op::Narrow {
        axis: rank - 1,
        start,
        len: half,
    };
    let x1 = e.op(part(0), &[x])?;
    let x2 = e.op(part(half), &[x])?;
    // angle[t, i] = t * base^(-2i / D), from positions along T and along the half width.
    let position = e.op(Op::Iota { axis: rank - 2 }, &[x])?;
    let pair = e.op(Op::Iota { axis: rank - 1 }, &[x1])?;
    let rate = e.constant(-2.0 * base.ln() / width as f64);
    let exponent = e.op(Op::Mul, &[pair, rate])?;
    let frequency = e.op(Op::Exp, &[exponent])?;
    let angle = e.op(Op::Mul, &[position, frequency])?;
    let (cos, sin) = (e.op(Op::Cos, &[angle])?, e.op(Op::Sin, &[angle])?);
    let (a1, b1) = (e.op(Op::Mul, &[x1, cos])?, e.op(Op::Mul, &[x2, sin])?);
    let first = e.op(Op::Sub, &[a1, b1])?;
    let (a2, b2) = (e.op(Op::Mul, &[x1, sin])?, e.op(Op::Mul, &[x2, cos])?);
    let second = e.op(Op::Add, &[a2, b2])?;
    e.op(Op::Concat { axis: rank - 1 }, &[first, second])
}

pub(super) fn split_heads(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let heads = a.size(1)?.unwrap_or(0);
    let xs = e.shape(x).clone();
    let rank = xs.len();
    if rank < 2 {
        return Err(ShapeError::invalid(
            0,
            format!(
                "split_heads needs [.., T, C], found {}",
                crate::fmt_shape(&xs)
            ),
        ));
    }
    let width = &xs[rank - 1];
    if heads == 0 {
        e.blame(1);
        return Err(ShapeError::invalid(1, "split_heads needs at least 1 head"));
    }
    // A literal width is checked now; a generic one when the model is instantiated (the
    // reshape's element count becomes a relation over it); a symbolic one cannot be split.
    if let Some(c) = width.as_known()
        && c % heads != 0
    {
        e.blame(1);
        return Err(ShapeError::invalid(
            1,
            format!(
                "{heads} heads do not divide the width {c} of {}",
                crate::fmt_shape(&xs)
            ),
        )
        .with_help(format!(
            "use a head count that divides {c}, or a width that is a multiple of {heads}"
        )));
    }
    let mut split: Shape = xs[..rank - 1].to_vec();
    split.push(crate::Dim::known(heads));
    split.push(width.floor_div(heads as u64));
    let y = e.op(Op::Reshape { shape: split }, &[x])?;
    let mut perm: Vec<usize> = (0..rank + 1).collect();
    perm.swap(rank - 2, rank - 1);
    e.op(Op::Permute { perm }, &[y])
}

pub(super) fn merge_heads(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let xs = e.shape(x).clone();
    let rank = xs.len();
    if rank < 3 {
        return Err(ShapeError::invalid(
            0,
            format!(
                "merge_heads needs [.., H, T, D], found {}",
                crate::fmt_shape(&xs)
            ),
        ));
    }
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 3, rank - 2);
    let y = e.op(Op::Permute { perm }, &[x])?;
    let mut merged: Shape = xs[..rank - 3].to_vec();
    merged.push(xs[rank - 2].clone());
    merged.push(xs[rank - 3].mul(&xs[rank - 1]));
    e.op(Op::Reshape { shape: merged }, &[y])
}

pub(super) fn narrow(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (start, len) = (a.size(2)?.unwrap_or(0), a.size(3)?.unwrap_or(0));
    if len == 0 {
        e.blame(3);
        return Err(ShapeError::invalid(
            3,
            "`narrow` needs a length of at least 1",
        ));
    }
    e.op(
        Op::Narrow {
            axis: a.axis(1)?,
            start,
            len,
        },
        &[a.tensor(0)?],
    )
}

/// Scaled dot-product attention, `softmax(q k^T / sqrt(D) + mask) v`, over the last two axes
/// of `q: [.., Tq, D]`, `k: [.., Tk, D]`, `v: [.., Tk, Dv]` (leading axes broadcast as in
/// matmul). With `causal`, query `i` sees keys `0..=i` (PyTorch's `is_causal`; it needs
/// `Tq == Tk`: a decoding step with a cache attends to every cached key without a mask).
/// The scores are a `[.., Tq, Tk]` value here; the softmax is one row kernel forward and
/// backward.
pub(super) fn attention(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (q, k, v) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
    let causal = a.flag(3)?;
    let (qs, ks, vs) = (e.shape(q).clone(), e.shape(k).clone(), e.shape(v).clone());
    for (i, (s, what)) in [(&qs, "q"), (&ks, "k"), (&vs, "v")].into_iter().enumerate() {
        if s.len() < 2 {
            e.blame(i);
            return Err(ShapeError::invalid(
                i,
                format!(
                    "attention needs {what} with [.., T, D] axes, found {}",
                    crate::fmt_shape(s)
                ),
            ));
        }
    }
    let (rq, rk, rv) = (qs.len(), ks.len(), vs.len());
    // Queries and keys are compared feature by feature: their widths agree.
    let mut want_k = ks.clone();
    want_k[rk - 1] = qs[rq - 1].clone();
    if !e.same_shape(&want_k, &ks) {
        e.blame(1);
        return Err(ShapeError::mismatch(1, want_k, &ks).with_help(format!(
            "q and k are compared feature by feature, so their last dimensions agree; q is {}",
            crate::fmt_shape(&qs)
        )));
    }
    // One value per key.
    let mut want_v = vs.clone();
    want_v[rv - 2] = ks[rk - 2].clone();
    if !e.same_shape(&want_v, &vs) {
        e.blame(2);
        return Err(ShapeError::mismatch(2, want_v, &vs).with_help(format!(
            "v holds one row per key, so its second-to-last dimension is k's; k is {}",
            crate::fmt_shape(&ks)
        )));
    }
    let Some(width) = qs[rq - 1].as_known().filter(|&d| d > 0) else {
        e.blame(0);
        return Err(ShapeError::invalid(
            0,
            format!(
                "attention scales by 1/sqrt(head size), so the head size must be a literal; found {} in {}",
                qs[rq - 1],
                crate::fmt_shape(&qs)
            ),
        ));
    };
    if causal {
        let (tq, tk) = (vec![qs[rq - 2].clone()], vec![ks[rk - 2].clone()]);
        if !e.same_shape(&tq, &tk) {
            e.blame(1);
            return Err(ShapeError::invalid(
                1,
                format!(
                    "causal attention needs as many queries as keys; q has {} and k {}",
                    qs[rq - 2],
                    ks[rk - 2]
                ),
            )
            .with_help(
                "a decoding step against cached keys sees all of them: drop `causal` there",
            ));
        }
    }
    // Self-attention (q, k, v of one shape, as in training) is one flash-style core op with
    // a fused backward; other shapes (a decoding step against cached keys, broadcast batch
    // axes) are the composition below.
    if e.same_shape(&qs, &ks) && e.same_shape(&ks, &vs) {
        return autocast_product(e, Op::Attention { causal }, &[q, k, v]);
    }
    // Rounded as the core op's operands and result are, so a decoding step computes what
    // the training pass did.
    let (q, k, v) = (rounded(e, q)?, rounded(e, k)?, rounded(e, v)?);
    let mut perm: Vec<usize> = (0..rk).collect();
    perm.swap(rk - 2, rk - 1);
    let kt = e.op(Op::Permute { perm }, &[k])?;
    let scores = e.op(Op::MatMul, &[q, kt])?;
    let scale = e.constant(1.0 / (width as f64).sqrt());
    let mut scores = e.op(Op::Mul, &[scores, scale])?;
    if causal {
        // Key j is hidden from query i when j > i; a large finite value, not -inf, keeps
        // every intermediate finite (the diagonal is never hidden, so each row has a max).
        let r = e.shape(scores).len();
        let rows = e.op(Op::Iota { axis: r - 2 }, &[scores])?;
        let cols = e.op(Op::Iota { axis: r - 1 }, &[scores])?;
        let future = e.op(Op::Compare { cmp: Cmp::Gt }, &[cols, rows])?;
        let hidden = e.constant(-1e30);
        scores = e.op(Op::Select, &[future, hidden, scores])?;
    }
    let r = e.shape(scores).len();
    let weights = softmax(e, scores, r - 1, false)?;
    let out = e.op(Op::MatMul, &[weights, v])?;
    e.op(Op::Autocast, &[out])
}

/// `x` rounded to the call's precision (`Op::Autocast`) when it is a float; an integer is
/// left for the op that reads it to refuse in its own words.
pub fn rounded(e: &mut dyn Emit, x: NodeId) -> Result<NodeId, ShapeError> {
    if e.dtype(x) == DType::F32 {
        e.op(Op::Autocast, &[x])
    } else {
        Ok(x)
    }
}

/// `op` over `args` as PyTorch's autocast computes a product: every operand rounded to the
/// call's precision, the product accumulated in f32, the result rounded (all the identity at
/// f32; see `rtx_ir::Precision`).
pub fn autocast_product(e: &mut dyn Emit, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError> {
    let mut operands = Vec::with_capacity(args.len());
    for &a in args {
        operands.push(rounded(e, a)?);
    }
    let y = e.op(op, &operands)?;
    e.op(Op::Autocast, &[y])
}
