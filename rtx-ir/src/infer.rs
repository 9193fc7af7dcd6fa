//! Shape rules: one per op, run by the macro at expansion and by the executor at run time.
//!
//! A rule sees argument shapes whose dimensions may be literal, symbolic or generic. Literal
//! and symbolic dimensions must agree exactly (`B` never equals `T`), and a generic parameter
//! equals only itself. A compound relation over generic parameters (`C*H*W` against `FLAT`)
//! may hold for some values, so the rule records an `Obligation` in the `Unifier`; the macro
//! checks it when the model is instantiated with concrete values.

// One file on purpose: the shape rules are a single exhaustive `match` over `Op`, so adding a
// core op fails to compile until its rule is written here, and the unifier they share lives
// beside them. It will shrink as composite ops (softmax, cross_entropy, pools, conv grads)
// move into `library.rs` as compositions; the unit tests at the end could move to a file of
// their own then.

use crate::dim::{Atom, Dim};
use crate::op::{DType, Op, Shape};
use std::fmt;

/// Why a shape rule rejected its arguments. `arg` says which argument is at fault, so the
/// macro can point at that sub-expression.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeError {
    pub arg: usize,
    pub kind: ShapeErrorKind,
    pub help: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ShapeErrorKind {
    /// The argument should have had shape `expected`; `axis` is the first dimension that differs
    /// (None when the ranks differ).
    Mismatch {
        expected: Shape,
        found: Shape,
        axis: Option<usize>,
    },
    /// Two shapes that NumPy broadcasting cannot join; `axis` counts from the right of `b`.
    Broadcast {
        a: Shape,
        b: Shape,
        dim_a: Dim,
        dim_b: Dim,
    },
    /// Anything else, worded in full.
    Invalid(String),
}

impl ShapeError {
    pub(crate) fn mismatch(arg: usize, expected: Shape, found: &Shape) -> ShapeError {
        let axis = if expected.len() == found.len() {
            expected.iter().zip(found.iter()).position(|(e, f)| e != f)
        } else {
            None
        };
        ShapeError {
            arg,
            kind: ShapeErrorKind::Mismatch {
                expected,
                found: found.clone(),
                axis,
            },
            help: None,
        }
    }

    pub(crate) fn invalid(arg: usize, msg: impl Into<String>) -> ShapeError {
        ShapeError {
            arg,
            kind: ShapeErrorKind::Invalid(msg.into()),
            help: None,
        }
    }

    pub(crate) fn with_help(mut self, help: impl Into<String>) -> ShapeError {
        self.help = Some(help.into());
        self
    }

    /// The message without the op's call site: "expected [B, 127], found [B, 128]".
    pub fn detail(&self) -> String {
        match &self.kind {
            ShapeErrorKind::Mismatch {
                expected,
                found,
                axis,
            } => {
                let mut s = format!(
                    "expected {}, found {}",
                    fmt_shape(expected),
                    fmt_shape(found)
                );
                match axis {
                    Some(a) => {
                        s += &format!(
                            " (dimension {a}: expected {}, found {})",
                            expected[*a], found[*a]
                        )
                    }
                    None if expected.len() != found.len() => {
                        s += &format!(" (rank {} vs {})", expected.len(), found.len())
                    }
                    None => {}
                }
                s
            }
            ShapeErrorKind::Broadcast { a, b, dim_a, dim_b } => format!(
                "cannot broadcast {} with {}: dimension {} does not match {} and neither is 1",
                fmt_shape(a),
                fmt_shape(b),
                dim_a,
                dim_b
            ),
            ShapeErrorKind::Invalid(m) => m.clone(),
        }
    }
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.detail())?;
        if let Some(h) = &self.help {
            write!(f, "; help: {h}")?;
        }
        Ok(())
    }
}

/// `[B, 64]`.
pub fn fmt_shape(s: &[Dim]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// A relation between dimensions that holds for some values of the model's generic parameters
/// and not for others (`C*H*W == FLAT`, a window that fits only a large enough `H`): it is
/// checked when the model is instantiated with concrete values.
#[derive(Clone, Debug, PartialEq)]
pub enum Obligation {
    /// The two dimensions must be equal.
    Equal(Dim, Dim),
    /// The dimension must be at least 1 (a window's output size).
    Positive(Dim),
}

/// Decides dimension equality, and records what only the instantiation can decide.
///
/// Literal and symbolic dimensions are equal only when they are the same expression. A generic
/// parameter equals only itself: `IN` against `64` or `IN` against `HID` is a mismatch, reported
/// like a literal one, because the generic model must be right for every value. A compound
/// relation over generic parameters (`C*H*W` against `FLAT`) can hold for some values: it
/// becomes an [`Obligation`], checked when the model is given concrete values.
#[derive(Default, Debug, Clone)]
pub struct Unifier {
    pub obligations: Vec<Obligation>,
}

/// A literal, or one generic parameter alone: two different ones are never equal for every value.
fn is_simple(d: &Dim) -> bool {
    d.as_const().is_some() || matches!(d.as_single_atom(), Some(Atom::Param(_)))
}

impl Unifier {
    pub fn same(&mut self, a: &Dim, b: &Dim) -> bool {
        if a == b {
            return true;
        }
        if is_simple(a) && is_simple(b) {
            return false;
        }
        // Symbols are bound at run time; only a difference over generic parameters alone, or
        // one that is a product of symbols times such a difference (`B*T*D` against
        // `4*B*T*floor(D/4)`), can be decided at instantiation, and then on the sides with
        // the symbols divided out (`D` against `4*floor(D/4)`).
        let diff = a.sub(b);
        let Some(factor) = diff.common_symbol_factor() else {
            return false;
        };
        let (a, b) = match (a.exact_div(&factor), b.exact_div(&factor)) {
            (Some(x), Some(y)) if !x.has_sym() && !y.has_sym() => (x, y),
            _ => match diff.exact_div(&factor) {
                Some(rest) => (rest, Dim::known(0)),
                None => return false,
            },
        };
        let rest = a.sub(&b);
        // Never equal for positive parameters: `IN` against `HID`, `IN` against `2*IN`.
        if !rest.has_param() || (is_simple(&a) && is_simple(&b)) || rest.never_zero() {
            return false;
        }
        self.obligations.push(Obligation::Equal(a, b));
        true
    }

    /// `d >= 1` where the macro can decide it; over generic parameters, an obligation.
    /// Symbolic sizes are checked when the graph runs.
    pub fn positive(&mut self, d: &Dim) -> bool {
        if let Some(v) = d.as_const() {
            return v >= 1;
        }
        if d.has_param() && !d.has_sym() {
            self.obligations.push(Obligation::Positive(d.clone()));
        }
        true
    }

    /// `same` for every axis, and equal ranks.
    pub fn same_shape(&mut self, a: &Shape, b: &Shape) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| self.same(x, y))
    }
}

/// NumPy broadcasting of two symbolic shapes.
pub fn broadcast(a: &Shape, b: &Shape, u: &mut Unifier) -> Result<Shape, ShapeError> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            Some(&a[i + a.len() - rank])
        } else {
            None
        };
        let db = if i + b.len() >= rank {
            Some(&b[i + b.len() - rank])
        } else {
            None
        };
        out.push(match (da, db) {
            (Some(x), None) => x.clone(),
            (None, Some(y)) => y.clone(),
            (Some(x), Some(y)) if x.is_one() => y.clone(),
            (Some(x), Some(y)) if y.is_one() => x.clone(),
            (Some(x), Some(y)) if u.same(x, y) => x.clone(),
            (Some(x), Some(y)) => {
                return Err(ShapeError {
                    arg: 1,
                    kind: ShapeErrorKind::Broadcast {
                        a: a.clone(),
                        b: b.clone(),
                        dim_a: x.clone(),
                        dim_b: y.clone(),
                    },
                    help: Some(
                        "make the dimensions equal, or 1 where one operand should be repeated"
                            .into(),
                    ),
                });
            }
            (None, None) => Dim::known(1),
        });
    }
    Ok(out)
}

fn check_axes(axes: &[usize], rank: usize, op: &str) -> Result<(), ShapeError> {
    for &a in axes {
        if a >= rank {
            return Err(ShapeError::invalid(
                0,
                format!("{op} axis {a} is out of range for a tensor of rank {rank}"),
            )
            .with_help(format!(
                "valid axes are 0..{rank} (or -{rank}..-1 counted from the end)"
            )));
        }
    }
    Ok(())
}

fn reduced(shape: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::new();
    for (i, d) in shape.iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(Dim::known(1));
            }
        } else {
            out.push(d.clone());
        }
    }
    out
}

fn need_rank(arg: usize, s: &Shape, rank: usize, what: &str) -> Result<(), ShapeError> {
    if s.len() != rank {
        return Err(ShapeError::invalid(
            arg,
            format!(
                "{what} needs a rank-{rank} tensor, found {} (rank {})",
                fmt_shape(s),
                s.len()
            ),
        ));
    }
    Ok(())
}

fn need_f32(arg: usize, dt: DType, op: &str) -> Result<(), ShapeError> {
    if dt != DType::F32 {
        return Err(ShapeError::invalid(
            arg,
            format!("{op} needs a float tensor, found an integer tensor"),
        ));
    }
    Ok(())
}

/// Output size of a sliding window: `(n + 2*pad - k) / stride + 1`.
pub fn window_out(n: &Dim, k: &Dim, stride: usize, pad: usize) -> Dim {
    n.add(&Dim::known(pad.saturating_mul(2)))
        .sub(k)
        .floor_div(stride as u64)
        .add(&Dim::known(1))
}

fn window_dims(
    op: &str,
    x: &Shape,
    kernel: [&Dim; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    u: &mut Unifier,
) -> Result<[Dim; 2], ShapeError> {
    let mut out = [Dim::known(0), Dim::known(0)];
    for i in 0..2 {
        if stride[i] == 0 {
            return Err(ShapeError::invalid(
                0,
                format!("{op} stride must be at least 1"),
            ));
        }
        // Beyond 2^31 a window parameter is corrupt, not a model: refuse it before any
        // arithmetic on it can overflow.
        const LIMIT: usize = 1 << 31;
        if padding[i] > LIMIT || stride[i] > LIMIT {
            return Err(ShapeError::invalid(
                0,
                format!(
                    "{op} padding {} or stride {} is out of range (at most {LIMIT})",
                    padding[i], stride[i]
                ),
            ));
        }
        if let Some(k) = kernel[i].as_known()
            && k > LIMIT
        {
            return Err(ShapeError::invalid(
                0,
                format!("{op} kernel size {k} is out of range (at most {LIMIT})"),
            ));
        }
        if kernel[i].as_known() == Some(0) {
            let axis = if i == 0 { "height" } else { "width" };
            return Err(ShapeError::invalid(
                0,
                format!("{op} kernel {axis} must be at least 1"),
            ));
        }
        let n = &x[2 + i];
        let o = window_out(n, kernel[i], stride[i], padding[i]);
        let room = n
            .add(&Dim::known(padding[i].saturating_mul(2)))
            .sub(kernel[i]);
        // The output is at least 1 exactly when the padded input holds one window.
        if !u.positive(&room.add(&Dim::known(1))) {
            let axis = if i == 0 { "height" } else { "width" };
            return Err(ShapeError::invalid(
                    0,
                    format!(
                        "{op} output {axis} would be below 1: input {axis} {n} with padding {} is smaller than the kernel {}",
                        padding[i], kernel[i]
                    ),
                )
                .with_help("use a smaller kernel, more padding, or a larger input"));
        }
        out[i] = o;
    }
    Ok(out)
}

/// Checks that the output gradient `found` (argument `arg` of a backward op) has the shape of
/// the forward op's output.
fn need_grad_shape(
    arg: usize,
    expected: Shape,
    found: &Shape,
    op: &str,
    u: &mut Unifier,
) -> Result<(), ShapeError> {
    if !u.same_shape(&expected, found) {
        return Err(
            ShapeError::mismatch(arg, expected, found).with_help(format!(
                "the gradient argument of {op} must have the shape of the forward op's output"
            )),
        );
    }
    Ok(())
}

/// Runs the shape rule of the forward op `op` of a backward op; `args[i]` of the forward op is
/// argument `from[i]` of the backward op, which errors are renumbered to.
fn forward_shape(
    op: &Op,
    args: &[(&Shape, DType)],
    from: &[usize],
    u: &mut Unifier,
) -> Result<Shape, ShapeError> {
    let fwd: Vec<(&Shape, DType)> = from.iter().map(|&i| args[i]).collect();
    infer(op, &fwd, u).map(|(s, _)| s).map_err(|mut e| {
        e.arg = from.get(e.arg).copied().unwrap_or(e.arg);
        e
    })
}

/// The shape rule of `op` applied to its arguments' shapes and dtypes.
pub fn infer(
    op: &Op,
    args: &[(&Shape, DType)],
    u: &mut Unifier,
) -> Result<(Shape, DType), ShapeError> {
    let d = op.def();
    if d.arity != usize::MAX && args.len() != d.arity {
        return Err(ShapeError::invalid(
            0,
            format!(
                "{} takes {} argument(s), found {}",
                d.name,
                d.arity,
                args.len()
            ),
        ));
    }
    let f32_out = |s: Shape| Ok((s, DType::F32));
    let sh = |i: usize| args[i].0;
    match op {
        Op::Input { shape, dtype, .. } => Ok((shape.clone(), *dtype)),
        Op::Param { shape, .. } => f32_out(shape.clone()),
        Op::Const { .. } => f32_out(vec![]),
        Op::StopGradient
        | Op::Autocast
        | Op::AutocastGrad
        | Op::Neg
        | Op::Relu
        | Op::Gelu
        | Op::GeluTanh
        | Op::Tanh
        | Op::Sin
        | Op::Cos
        | Op::Sigmoid
        | Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::PowScalar { .. } => {
            need_f32(0, args[0].1, d.name)?;
            f32_out(sh(0).clone())
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Maximum | Op::Minimum | Op::Compare { .. } => {
            need_f32(0, args[0].1, d.name)?;
            need_f32(1, args[1].1, d.name)?;
            f32_out(broadcast(sh(0), sh(1), u)?)
        }
        Op::Select => {
            for (i, arg) in args.iter().enumerate() {
                need_f32(i, arg.1, d.name)?;
            }
            let ab = broadcast(sh(1), sh(2), u).map_err(|mut e| {
                e.arg += 1;
                e
            })?;
            f32_out(broadcast(sh(0), &ab, u)?)
        }
        Op::Sum { axes, keepdim } | Op::Mean { axes, keepdim } | Op::Max { axes, keepdim } => {
            check_axes(axes, sh(0).len(), d.name)?;
            f32_out(reduced(sh(0), axes, *keepdim))
        }
        Op::MatMul => {
            let (a, b) = (sh(0), sh(1));
            if a.len() < 2 {
                return Err(ShapeError::invalid(
                    0,
                    format!("matmul needs rank >= 2 operands, found {}", fmt_shape(a)),
                ));
            }
            if b.len() < 2 {
                return Err(ShapeError::invalid(
                    1,
                    format!("matmul needs rank >= 2 operands, found {}", fmt_shape(b)),
                ));
            }
            let k = &a[a.len() - 1];
            let k2 = &b[b.len() - 2];
            if !u.same(k, k2) {
                let mut expected = b.clone();
                let n = expected.len();
                expected[n - 2] = k.clone();
                return Err(ShapeError::mismatch(1, expected, b).with_help(format!(
                    "the inner dimensions of a matmul must agree: the left operand {} has {k} columns, the right one {} has {k2} rows",
                    fmt_shape(a),
                    fmt_shape(b)
                )));
            }
            let (batch_a, batch_b) = (a[..a.len() - 2].to_vec(), b[..b.len() - 2].to_vec());
            let batch = broadcast(&batch_a, &batch_b, u).map_err(|e| {
                let ShapeErrorKind::Broadcast { dim_a, dim_b, .. } = &e.kind else {
                    return e;
                };
                // Both operands in full: the batch slices alone read like the operands.
                ShapeError::invalid(
                    1,
                    format!(
                        "the batch dimensions of {} (batch {}) and {} (batch {}) do not broadcast: {dim_a} against {dim_b}",
                        fmt_shape(a),
                        fmt_shape(&batch_a),
                        fmt_shape(b),
                        fmt_shape(&batch_b)
                    ),
                )
                .with_help("a matmul multiplies the last two dimensions; the ones before them are batch dimensions, which must be equal or 1")
            })?;
            let mut out = batch;
            out.push(a[a.len() - 2].clone());
            out.push(b[b.len() - 1].clone());
            f32_out(out)
        }
        Op::Attention { causal } => {
            let (q, k, v) = (sh(0), sh(1), sh(2));
            for (i, (s, what)) in [(q, "q"), (k, "k"), (v, "v")].into_iter().enumerate() {
                if s.len() < 2 || s.len() != q.len() {
                    return Err(ShapeError::invalid(
                        i,
                        format!(
                            "attention needs q, k and v of one rank >= 2 ([.., T, D]); {what} is {}",
                            fmt_shape(s)
                        ),
                    ));
                }
            }
            let r = q.len();
            let mut want_k = q.clone();
            want_k[r - 2] = k[r - 2].clone();
            if !u.same_shape(&want_k, k) {
                return Err(ShapeError::mismatch(1, want_k, k)
                    .with_help("keys share the queries' batch axes and width"));
            }
            let mut want_v = k.clone();
            want_v[r - 1] = v[r - 1].clone();
            if !u.same_shape(&want_v, v) {
                return Err(
                    ShapeError::mismatch(2, want_v, v).with_help("values hold one row per key")
                );
            }
            if *causal && !u.same(&q[r - 2], &k[r - 2]) {
                return Err(ShapeError::invalid(
                    1,
                    format!(
                        "causal attention needs as many queries as keys, found {} and {}",
                        q[r - 2],
                        k[r - 2]
                    ),
                ));
            }
            let mut out = q.clone();
            out[r - 1] = v[r - 1].clone();
            f32_out(out)
        }
        Op::Conv2d { stride, padding } => {
            let (x, w) = (sh(0), sh(1));
            need_rank(0, x, 4, "conv2d input [N, C, H, W]")?;
            need_rank(1, w, 4, "conv2d weight [O, C, KH, KW]")?;
            if !u.same(&x[1], &w[1]) {
                let expected = vec![x[0].clone(), w[1].clone(), x[2].clone(), x[3].clone()];
                return Err(ShapeError::mismatch(0, expected, x).with_help(format!(
                    "the convolution expects {} input channels, the input has {}",
                    w[1], x[1]
                )));
            }
            let [oh, ow] = window_dims(d.name, x, [&w[2], &w[3]], *stride, *padding, u)?;
            f32_out(vec![x[0].clone(), w[0].clone(), oh, ow])
        }
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        }
        | Op::AvgPool2d {
            kernel,
            stride,
            padding,
        } => {
            let x = sh(0);
            need_rank(0, x, 4, &format!("{} input [N, C, H, W]", d.name))?;
            let k = [Dim::known(kernel[0]), Dim::known(kernel[1])];
            let [oh, ow] = window_dims(d.name, x, [&k[0], &k[1]], *stride, *padding, u)?;
            // PyTorch's rule: a window may hang over the edge by at most half its size, so every
            // window holds at least one real element (else max pooling yields -inf).
            for i in 0..2 {
                if padding[i] > kernel[i] / 2 {
                    return Err(ShapeError::invalid(
                        0,
                        format!(
                            "{} padding {} is more than half the kernel size {}",
                            d.name, padding[i], kernel[i]
                        ),
                    )
                    .with_help(format!(
                        "use padding at most {} for a kernel of {}",
                        kernel[i] / 2,
                        kernel[i]
                    )));
                }
            }
            f32_out(vec![x[0].clone(), x[1].clone(), oh, ow])
        }
        Op::Embedding => {
            need_rank(0, sh(0), 2, "embedding table [V, D]")?;
            if args[1].1 != DType::I64 {
                return Err(ShapeError::invalid(
                    1,
                    format!(
                        "embedding ids must be integer (i64), found a float tensor of shape {}",
                        fmt_shape(sh(1))
                    ),
                )
                .with_help(format!(
                    "declare the ids as integers in the signature, e.g. `ids: i64{}`",
                    fmt_shape(sh(1))
                )));
            }
            let mut out = sh(1).clone();
            out.push(sh(0)[1].clone());
            f32_out(out)
        }
        Op::Pick => {
            let (x, ids) = (sh(0), sh(1));
            if x.is_empty() {
                return Err(ShapeError::invalid(
                    0,
                    "picking one element per row needs an axis to pick from; a scalar has none",
                ));
            }
            if args[1].1 != DType::I64 {
                return Err(ShapeError::invalid(
                    1,
                    "the indices must be integers (i64), found a float tensor",
                ));
            }
            let rows = x[..x.len() - 1].to_vec();
            if !u.same_shape(&rows, ids) {
                return Err(ShapeError::mismatch(1, rows, ids)
                    .with_help("there is one index (class label) per row of the values"));
            }
            f32_out(rows)
        }
        Op::Positions { axis } => {
            check_axes(&[*axis], sh(0).len(), d.name)?;
            Ok((vec![sh(0)[*axis].clone()], DType::I64))
        }
        Op::TopK { k } | Op::TopKIndices { k } => {
            let x = sh(0);
            let Some(n) = x.last() else {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "{} needs a last axis to choose from, found a scalar",
                        d.name
                    ),
                ));
            };
            if *k == 0 {
                return Err(ShapeError::invalid(
                    0,
                    format!("{} needs k >= 1, found 0", d.name),
                ));
            }
            if let Some(n) = n.as_known()
                && *k > n
            {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "{} of {k} values from a last axis of {n} in {}",
                        d.name,
                        fmt_shape(x)
                    ),
                )
                .with_help(format!("k can be at most {n}")));
            }
            let mut out = x.clone();
            if let Some(last) = out.last_mut() {
                *last = Dim::known(*k);
            }
            let dtype = if matches!(op, Op::TopK { .. }) {
                DType::F32
            } else {
                DType::I64
            };
            Ok((out, dtype))
        }
        Op::TopKGrad { k } => {
            let out = forward_shape(&Op::TopK { k: *k }, args, &[0], u)?;
            need_grad_shape(1, out, sh(1), d.name, u)?;
            f32_out(sh(0).clone())
        }
        Op::ArgMax { axis } => {
            need_f32(0, args[0].1, d.name)?;
            check_axes(&[*axis], sh(0).len(), d.name)?;
            Ok((reduced(sh(0), &[*axis], false), DType::I64))
        }
        Op::Iota { axis } => {
            let x = sh(0);
            check_axes(&[*axis], x.len(), "iota")?;
            let mut out = vec![Dim::known(1); x.len()];
            out[*axis] = x[*axis].clone();
            f32_out(out)
        }
        Op::DropoutMask { p } => {
            if !(0.0..1.0).contains(p) {
                return Err(ShapeError::invalid(
                    0,
                    format!("dropout probability must be in [0, 1), found {p}"),
                ));
            }
            f32_out(sh(0).clone())
        }
        Op::Reshape { shape } => {
            let from: Dim = sh(0).iter().fold(Dim::known(1), |acc, d| acc.mul(d));
            let to: Dim = shape.iter().fold(Dim::known(1), |acc, d| acc.mul(d));
            if !u.same(&from, &to) {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "reshape from {} to {} changes the number of elements ({} vs {})",
                        fmt_shape(sh(0)),
                        fmt_shape(shape),
                        from,
                        to
                    ),
                )
                .with_help(
                    "the product of the new dimensions must equal the product of the old ones",
                ));
            }
            Ok((shape.clone(), args[0].1))
        }
        Op::Permute { perm } => {
            let r = sh(0).len();
            let mut seen = vec![false; r];
            let valid = perm.len() == r
                && perm
                    .iter()
                    .all(|&p| p < r && !std::mem::replace(&mut seen[p], true));
            if !valid {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "permutation {perm:?} does not reorder the {r} axes of {}",
                        fmt_shape(sh(0))
                    ),
                ));
            }
            Ok((perm.iter().map(|&p| sh(0)[p].clone()).collect(), args[0].1))
        }
        Op::Concat { axis } => {
            if args.is_empty() {
                return Err(ShapeError::invalid(0, "concat needs at least one tensor"));
            }
            let first = sh(0);
            check_axes(&[*axis], first.len(), "concat")?;
            let mut total = first[*axis].clone();
            for (i, (s, _)) in args.iter().enumerate().skip(1) {
                let mut expected = first.clone();
                if s.len() == first.len() {
                    expected[*axis] = s[*axis].clone();
                }
                if !u.same_shape(&expected, s) {
                    return Err(ShapeError::mismatch(i, expected, s).with_help(format!(
                        "concatenated tensors must agree on every dimension except the concat axis {axis}"
                    )));
                }
                total = total.add(&s[*axis]);
            }
            let mut out = first.clone();
            out[*axis] = total;
            Ok((out, args[0].1))
        }
        Op::Narrow { axis, start, len } => {
            let x = sh(0);
            check_axes(&[*axis], x.len(), "narrow")?;
            if let Some(n) = x[*axis].as_known()
                && start.saturating_add(*len) > n
            {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "narrow {start}..{} is out of range for dimension {axis} of size {n}",
                        start.saturating_add(*len)
                    ),
                ));
            }
            let mut out = x.clone();
            out[*axis] = Dim::known(*len);
            Ok((out, args[0].1))
        }
        Op::BroadcastTo => {
            let out = broadcast(sh(0), sh(1), u)?;
            if !u.same_shape(&out, sh(1)) {
                return Err(ShapeError::mismatch(0, sh(1).clone(), sh(0)));
            }
            f32_out(sh(1).clone())
        }
        // Backward ops: every gradient argument must have the shape of the forward output it
        // is the gradient of, so kernels (which trust these rules) never see a mismatch.
        Op::SumTo => {
            let (g, like) = (sh(0), sh(1));
            let fits =
                like.len() <= g.len() && broadcast(like, g, u).is_ok_and(|b| u.same_shape(&b, g));
            if !fits {
                return Err(ShapeError::invalid(
                    1,
                    format!(
                        "sum_to: {} does not broadcast to the gradient's shape {}",
                        fmt_shape(like),
                        fmt_shape(g)
                    ),
                ));
            }
            f32_out(like.clone())
        }
        Op::ReluGrad | Op::GeluGrad | Op::GeluTanhGrad => {
            need_grad_shape(1, sh(0).clone(), sh(1), d.name, u)?;
            f32_out(sh(0).clone())
        }
        Op::MeanGrad { axes, keepdim } | Op::MaxGrad { axes, keepdim } => {
            check_axes(axes, sh(0).len(), d.name)?;
            need_grad_shape(1, reduced(sh(0), axes, *keepdim), sh(1), d.name, u)?;
            f32_out(sh(0).clone())
        }
        Op::PickGrad => {
            let out = forward_shape(&Op::Pick, args, &[2, 1], u)?;
            need_grad_shape(0, out, sh(0), d.name, u)?;
            f32_out(sh(2).clone())
        }
        Op::Conv2dGradInput { stride, padding } => {
            let out = forward_shape(
                &Op::Conv2d {
                    stride: *stride,
                    padding: *padding,
                },
                args,
                &[2, 1],
                u,
            )?;
            need_grad_shape(0, out, sh(0), d.name, u)?;
            f32_out(sh(2).clone())
        }
        Op::AttentionGrad { causal } => {
            let out = forward_shape(&Op::Attention { causal: *causal }, args, &[0, 1, 2], u)?;
            need_grad_shape(3, out, sh(3), d.name, u)?;
            for i in 1..3 {
                if !u.same_shape(sh(0), sh(i)) {
                    return Err(ShapeError::mismatch(i, sh(0).clone(), sh(i)).with_help(
                        "the stacked attention gradient needs q, k and v of one shape",
                    ));
                }
            }
            let mut out = vec![Dim::known(3)];
            out.extend(sh(0).iter().cloned());
            f32_out(out)
        }
        Op::Conv2dGradWeight { stride, padding } => {
            let out = forward_shape(
                &Op::Conv2d {
                    stride: *stride,
                    padding: *padding,
                },
                args,
                &[0, 2],
                u,
            )?;
            need_grad_shape(1, out, sh(1), d.name, u)?;
            f32_out(sh(2).clone())
        }
        Op::MaxPool2dGrad {
            kernel,
            stride,
            padding,
        } => {
            let out = forward_shape(
                &Op::MaxPool2d {
                    kernel: *kernel,
                    stride: *stride,
                    padding: *padding,
                },
                args,
                &[0],
                u,
            )?;
            need_grad_shape(1, out, sh(1), d.name, u)?;
            f32_out(sh(0).clone())
        }
        Op::AvgPool2dGrad {
            kernel,
            stride,
            padding,
        } => {
            let out = forward_shape(
                &Op::AvgPool2d {
                    kernel: *kernel,
                    stride: *stride,
                    padding: *padding,
                },
                args,
                &[0],
                u,
            )?;
            need_grad_shape(1, out, sh(1), d.name, u)?;
            f32_out(sh(0).clone())
        }
        Op::EmbeddingGrad => {
            let out = forward_shape(&Op::Embedding, args, &[2, 1], u)?;
            need_grad_shape(0, out, sh(0), d.name, u)?;
            f32_out(sh(2).clone())
        }
        Op::PadNarrow { axis, start } => {
            let (g, full) = (sh(0), sh(1));
            check_axes(&[*axis], full.len(), d.name)?;
            let mut expected = full.clone();
            if g.len() == full.len() {
                expected[*axis] = g[*axis].clone();
            }
            need_grad_shape(0, expected, g, d.name, u)?;
            if let (Some(len), Some(n)) = (g[*axis].as_known(), full[*axis].as_known())
                && start.saturating_add(len) > n
            {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "pad_narrow {start}..{} is out of range for dimension {axis} of size {n}",
                        start.saturating_add(len)
                    ),
                ));
            }
            f32_out(full.clone())
        }
        Op::ConcatGrad { axis, index } => {
            let parts = args.get(1..).unwrap_or_default();
            if *index >= parts.len() {
                return Err(ShapeError::invalid(
                    0,
                    format!(
                        "concat_grad takes part {index} of {} concatenated tensors",
                        parts.len()
                    ),
                ));
            }
            let joined = forward_shape(
                &Op::Concat { axis: *axis },
                args,
                &(1..args.len()).collect::<Vec<_>>(),
                u,
            )?;
            need_grad_shape(0, joined, sh(0), d.name, u)?;
            f32_out(parts[*index].0.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(dims: &[&str]) -> Shape {
        dims.iter()
            .map(|d| match d.parse::<usize>() {
                Ok(n) => Dim::known(n),
                Err(_) if d.chars().all(|c| c.is_ascii_uppercase()) && d.len() <= 1 => Dim::sym(d),
                Err(_) => Dim::param(d),
            })
            .collect()
    }

    fn run(op: Op, args: &[Shape]) -> Result<Shape, ShapeError> {
        let a: Vec<(&Shape, DType)> = args.iter().map(|s| (s, DType::F32)).collect();
        infer(&op, &a, &mut Unifier::default()).map(|(s, _)| s)
    }

    #[test]
    fn matmul_with_symbolic_batch() {
        assert_eq!(
            run(Op::MatMul, &[s(&["B", "64"]), s(&["64", "10"])]).unwrap(),
            s(&["B", "10"])
        );
    }

    #[test]
    fn matmul_inner_mismatch_names_both() {
        let e = run(Op::MatMul, &[s(&["B", "64"]), s(&["63", "10"])]).unwrap_err();
        assert_eq!(e.arg, 1);
        assert!(
            e.detail().contains("expected [64, 10], found [63, 10]"),
            "{}",
            e.detail()
        );
    }

    #[test]
    fn different_symbols_do_not_broadcast() {
        let e = run(Op::Add, &[s(&["B", "T", "8"]), s(&["B", "8"])]).unwrap_err();
        assert!(matches!(e.kind, ShapeErrorKind::Broadcast { .. }));
    }

    #[test]
    fn different_generic_dims_are_a_mismatch() {
        let mut u = Unifier::default();
        let (a, b) = (s(&["B", "IN"]), s(&["HID", "10"]));
        assert!(infer(&Op::MatMul, &[(&a, DType::F32), (&b, DType::F32)], &mut u).is_err());
        assert!(u.obligations.is_empty());
    }

    #[test]
    fn a_generic_parameter_equals_only_itself() {
        let mut u = Unifier::default();
        assert!(u.same(&Dim::param("IN"), &Dim::param("IN")));
        assert!(!u.same(&Dim::param("IN"), &Dim::known(64)));
        assert!(!u.same(&Dim::param("IN"), &Dim::param("HID")));
        assert!(u.obligations.is_empty());
    }

    #[test]
    fn relations_that_fail_for_every_positive_value_are_mismatches() {
        let mut u = Unifier::default();
        let (b, inp, hid) = (Dim::sym("B"), Dim::param("IN"), Dim::param("HID"));
        assert!(!u.same(&b.mul(&inp), &b.mul(&hid)));
        assert!(!u.same(&inp, &inp.scale(2)));
        assert!(!u.same(&inp, &inp.add(&hid)));
        assert!(u.obligations.is_empty());
    }

    #[test]
    fn compound_generic_relations_become_obligations() {
        let mut u = Unifier::default();
        let chw = Dim::param("C").mul(&Dim::param("HW"));
        assert!(u.same(&chw, &Dim::param("FLAT")));
        assert_eq!(
            u.obligations,
            vec![Obligation::Equal(chw, Dim::param("FLAT"))]
        );
    }

    #[test]
    fn a_head_split_over_symbols_becomes_an_obligation_on_the_generic_part() {
        let mut u = Unifier::default();
        let bt = Dim::sym("B").mul(&Dim::sym("T"));
        let d = Dim::param("D");
        let split = bt.mul(&d.floor_div(4)).scale(4);
        assert!(u.same(&bt.mul(&d), &split));
        // Checked without the symbols, which have no value at instantiation.
        assert_eq!(
            u.obligations,
            vec![Obligation::Equal(d.clone(), d.floor_div(4).scale(4))]
        );
        // Symbols that do not factor out are decided now: B*D against T*D differ.
        assert!(!u.same(&Dim::sym("B").mul(&d), &Dim::sym("T").mul(&d)));
    }

    #[test]
    fn a_window_over_a_generic_size_becomes_an_obligation() {
        let mut u = Unifier::default();
        let conv = Op::Conv2d {
            stride: [1, 1],
            padding: [0, 0],
        };
        let (x, w) = (s(&["B", "1", "HH", "HH"]), s(&["4", "1", "5", "5"]));
        let (out, _) = infer(&conv, &[(&x, DType::F32), (&w, DType::F32)], &mut u).unwrap();
        assert_eq!(out[2].to_string(), "HH - 4");
        assert_eq!(
            u.obligations,
            vec![
                Obligation::Positive(Dim::param("HH").sub(&Dim::known(4))),
                Obligation::Positive(Dim::param("HH").sub(&Dim::known(4)))
            ]
        );
    }

    #[test]
    fn conv_output_below_one_is_an_error() {
        let e = run(
            Op::Conv2d {
                stride: [1, 1],
                padding: [0, 0],
            },
            &[s(&["B", "1", "2", "2"]), s(&["4", "1", "3", "3"])],
        );
        assert!(e.unwrap_err().detail().contains("below 1"));
    }

    #[test]
    fn pool_padding_over_half_the_kernel_is_an_error() {
        let pool = |padding| Op::MaxPool2d {
            kernel: [3, 3],
            stride: [1, 1],
            padding: [padding, padding],
        };
        assert!(run(pool(1), &[s(&["B", "1", "8", "8"])]).is_ok());

        let e = run(pool(2), &[s(&["B", "1", "8", "8"])]).unwrap_err();

        assert!(e.detail().contains("more than half"), "{}", e.detail());
    }

    #[test]
    fn absurd_window_parameters_are_errors_not_overflows() {
        let conv = Op::Conv2d {
            stride: [1, 1],
            padding: [usize::MAX, 0],
        };
        let e = run(conv, &[s(&["B", "1", "8", "8"]), s(&["4", "1", "3", "3"])]).unwrap_err();
        assert!(e.detail().contains("out of range"), "{}", e.detail());
    }

    #[test]
    fn conv_output_size_follows_pytorch() {
        let out = run(
            Op::Conv2d {
                stride: [2, 2],
                padding: [1, 1],
            },
            &[s(&["B", "3", "9", "8"]), s(&["4", "3", "3", "3"])],
        );
        assert_eq!(out.unwrap(), s(&["B", "4", "5", "4"]));
    }

    #[test]
    fn reshape_must_keep_element_count() {
        assert!(
            run(
                Op::Reshape {
                    shape: s(&["B", "65"])
                },
                &[s(&["B", "64"])]
            )
            .is_err()
        );
        assert!(
            run(
                Op::Reshape {
                    shape: s(&["B", "8", "8"])
                },
                &[s(&["B", "64"])]
            )
            .is_ok()
        );
    }
}
