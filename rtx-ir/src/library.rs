//! The user-facing ops of `graph!` that are compositions of core ops: one definition each.
//!
//! A definition is a row of `LIBRARY`: the name the user writes, its arguments (tensors first,
//! then number literals with their defaults), a line of documentation, and its lowering into
//! core ops. The macro reads the table to lower a call, to check its argument count and to list
//! the known ops in "unknown op" diagnostics; a core op's shape rule, run while lowering,
//! reports a mismatch at the user's call. Gradients come from differentiating the lowering, so
//! a new op here needs no backward rule, no kernel and no reference of its own. Adding one is a
//! row and a `fn`; its tests go in `tests/library.rs`.

use crate::graph::NodeId;
use crate::infer::ShapeError;
use crate::op::{Cmp, Op, Shape};

/// What a lowering builds with: core ops over earlier values, with shape rules checked.
pub trait Emit {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError>;
    /// A scalar constant, broadcast by the op that uses it.
    fn constant(&mut self, value: f64) -> NodeId;
    fn shape(&self, value: NodeId) -> &Shape;
    /// Whether two shapes are equal, as a shape rule decides it: a dimension that depends on a
    /// generic parameter may be left for rustc to check (an obligation), as in core rules.
    fn same_shape(&mut self, expected: &Shape, found: &Shape) -> bool;
}

type Lowering = fn(&mut dyn Emit, &[NodeId], &[f64]) -> Result<NodeId, ShapeError>;

/// One user-facing op.
pub struct LibraryOp {
    pub name: &'static str,
    /// Names of the tensor arguments, in order; a number literal is accepted for each too.
    pub tensors: &'static [&'static str],
    /// Names and defaults (`None`: required) of the trailing number-literal arguments.
    pub numbers: &'static [(&'static str, Option<f64>)],
    pub doc: &'static str,
    pub lower: Lowering,
}

impl LibraryOp {
    /// `(x, min, max)` or `(x, negative_slope = 0.01)`: the call form for diagnostics.
    pub fn signature(&self) -> String {
        let mut parts: Vec<String> = self.tensors.iter().map(|t| t.to_string()).collect();
        for (name, default) in self.numbers {
            parts.push(match default {
                Some(d) => format!("{name} = {d}"),
                None => name.to_string(),
            });
        }
        format!("{}({})", self.name, parts.join(", "))
    }
}

const fn row(
    name: &'static str,
    tensors: &'static [&'static str],
    numbers: &'static [(&'static str, Option<f64>)],
    doc: &'static str,
    lower: Lowering,
) -> LibraryOp {
    LibraryOp {
        name,
        tensors,
        numbers,
        doc,
        lower,
    }
}

/// The table.
pub const LIBRARY: &[LibraryOp] = &[
    row(
        "relu",
        &["x"],
        &[],
        "max(x, 0); gradient 0 at 0",
        |e, t, _| e.op(Op::Relu, &[t[0]]),
    ),
    row(
        "gelu",
        &["x"],
        &[],
        "x * Phi(x), the exact erf form",
        |e, t, _| e.op(Op::Gelu, &[t[0]]),
    ),
    row("tanh", &["x"], &[], "hyperbolic tangent", |e, t, _| {
        e.op(Op::Tanh, &[t[0]])
    }),
    row("sigmoid", &["x"], &[], "1 / (1 + exp(-x))", |e, t, _| {
        e.op(Op::Sigmoid, &[t[0]])
    }),
    row("exp", &["x"], &[], "e^x", |e, t, _| e.op(Op::Exp, &[t[0]])),
    row("log", &["x"], &[], "natural logarithm", |e, t, _| {
        e.op(Op::Log, &[t[0]])
    }),
    row("sqrt", &["x"], &[], "square root", |e, t, _| {
        e.op(Op::Sqrt, &[t[0]])
    }),
    row("neg", &["x"], &[], "-x", |e, t, _| e.op(Op::Neg, &[t[0]])),
    row(
        "detach",
        &["x"],
        &[],
        "x, with no gradient flowing back through it (PyTorch's `detach`)",
        |e, t, _| e.op(Op::StopGradient, &[t[0]]),
    ),
    row(
        "pow",
        &["x"],
        &[("exponent", None)],
        "x^exponent",
        |e, t, n| e.op(Op::PowScalar { exponent: n[0] }, &[t[0]]),
    ),
    row(
        "matmul",
        &["a", "b"],
        &[],
        "[.., M, K] @ [.., K, N], batch dims broadcast",
        |e, t, _| e.op(Op::MatMul, &[t[0], t[1]]),
    ),
    row(
        "mse",
        &["a", "b"],
        &[],
        "mean of squared differences of two values of one shape, a scalar",
        mse,
    ),
    row(
        "cross_entropy",
        &["logits", "labels"],
        &[],
        "mean over rows of -log_softmax(logits)[label]; logits [.., C], labels i64 [..]",
        cross_entropy,
    ),
    row("silu", &["x"], &[], "x * sigmoid(x)", silu),
    row("abs", &["x"], &[], "|x|; gradient 0 at 0", abs),
    row(
        "clamp",
        &["x"],
        &[("min", None), ("max", None)],
        "x limited to [min, max]; gradient 1 inside and on the bounds",
        clamp,
    ),
    row(
        "where",
        &["cond", "a", "b"],
        &[],
        "a where cond is nonzero (e.g. `x > 0`), else b; all three broadcast",
        select,
    ),
    row(
        "softplus",
        &["x"],
        &[("beta", Some(1.0))],
        "log(1 + exp(beta x)) / beta, computed without overflow",
        softplus,
    ),
    row(
        "leaky_relu",
        &["x"],
        &[("negative_slope", Some(0.01))],
        "x where x > 0, else negative_slope * x",
        leaky_relu,
    ),
    row(
        "maximum",
        &["a", "b"],
        &[],
        "elementwise larger value, broadcast; ties split the gradient",
        maximum,
    ),
    row(
        "minimum",
        &["a", "b"],
        &[],
        "elementwise smaller value, broadcast; ties split the gradient",
        minimum,
    ),
    row(
        "min",
        &["x"],
        &[],
        "smallest element of x (a scalar); `-max(-x)`",
        min_all,
    ),
    row(
        "layer_norm",
        &["x", "weight", "bias"],
        &[("eps", Some(1e-5))],
        "normalizes over the last axis, then scales by weight and shifts by bias (both [D])",
        layer_norm,
    ),
];

/// The definition of `name`, if it is a library op.
pub fn lookup(name: &str) -> Option<&'static LibraryOp> {
    LIBRARY.iter().find(|op| op.name == name)
}

fn mse(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    let (a, b) = (t[0], t[1]);
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

fn cross_entropy(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    let (logits, labels) = (t[0], t[1]);
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

fn silu(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    let s = e.op(Op::Sigmoid, &[t[0]])?;
    e.op(Op::Mul, &[t[0], s])
}

fn abs(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    // maximum(x, -x): at 0 the tie splits the gradient, +1/2 - 1/2 = 0, like PyTorch.
    let n = e.op(Op::Neg, &[t[0]])?;
    e.op(Op::Maximum, &[t[0], n])
}

fn clamp(e: &mut dyn Emit, t: &[NodeId], n: &[f64]) -> Result<NodeId, ShapeError> {
    // Selects rather than maximum/minimum, so a value on a bound keeps its full gradient.
    let (lo, hi) = (e.constant(n[0]), e.constant(n[1]));
    let below = e.op(Op::Compare { cmp: Cmp::Lt }, &[t[0], lo])?;
    let above = e.op(Op::Compare { cmp: Cmp::Gt }, &[t[0], hi])?;
    let upper = e.op(Op::Select, &[above, hi, t[0]])?;
    e.op(Op::Select, &[below, lo, upper])
}

fn select(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    e.op(Op::Select, &[t[0], t[1], t[2]])
}

fn softplus(e: &mut dyn Emit, t: &[NodeId], n: &[f64]) -> Result<NodeId, ShapeError> {
    // max(z, 0) + log(1 + exp(-|z|)) with z = beta x: never overflows, and its gradient at 0
    // is 1/2 (the tie of max splits it), sigmoid(0) as it should be.
    let beta = e.constant(n[0]);
    let z = e.op(Op::Mul, &[t[0], beta])?;
    let zero = e.constant(0.0);
    let pos = e.op(Op::Maximum, &[z, zero])?;
    let mag = abs(e, &[z], &[])?;
    let neg = e.op(Op::Neg, &[mag])?;
    let ex = e.op(Op::Exp, &[neg])?;
    let one = e.constant(1.0);
    let onep = e.op(Op::Add, &[one, ex])?;
    let lg = e.op(Op::Log, &[onep])?;
    let sp = e.op(Op::Add, &[pos, lg])?;
    e.op(Op::Div, &[sp, beta])
}

fn leaky_relu(e: &mut dyn Emit, t: &[NodeId], n: &[f64]) -> Result<NodeId, ShapeError> {
    let (zero, slope) = (e.constant(0.0), e.constant(n[0]));
    let pos = e.op(Op::Compare { cmp: Cmp::Gt }, &[t[0], zero])?;
    let scaled = e.op(Op::Mul, &[t[0], slope])?;
    e.op(Op::Select, &[pos, t[0], scaled])
}

fn maximum(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    e.op(Op::Maximum, &[t[0], t[1]])
}

fn minimum(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
    e.op(Op::Minimum, &[t[0], t[1]])
}

fn min_all(e: &mut dyn Emit, t: &[NodeId], _: &[f64]) -> Result<NodeId, ShapeError> {
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

fn layer_norm(e: &mut dyn Emit, t: &[NodeId], n: &[f64]) -> Result<NodeId, ShapeError> {
    let (x, w, b) = (t[0], t[1], t[2]);
    let rank = e.shape(x).len();
    if rank == 0 {
        return Err(ShapeError::invalid(
            0,
            "layer_norm normalizes over the last axis; a scalar has none",
        ));
    }
    // Weight and bias hold one value per feature: exactly [D], not anything that broadcasts.
    let features: Shape = vec![e.shape(x)[rank - 1].clone()];
    for (arg, v) in [(1, w), (2, b)] {
        if e.shape(v) != &features {
            return Err(ShapeError::mismatch(arg, features, e.shape(v)).with_help(
                "layer_norm's weight and bias have one value per feature of the last axis",
            ));
        }
    }
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
