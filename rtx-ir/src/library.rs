//! The user-facing ops of `graph!`: one definition each, as compositions of core ops.
//!
//! A definition is a row of `LIBRARY`: the name the user writes, its parameters in the order
//! the user writes them (tensors, lists of tensors, number literals, axes, `keepdim`, target
//! dimensions; optional ones have defaults), a line of documentation, and its lowering into
//! core ops. The macro reads the table to parse a call's arguments by their kinds, to check
//! their count, to lower the call and to list the known ops in "unknown op" diagnostics; a core
//! op's shape rule, run while lowering, reports a mismatch at the user's call. Gradients come
//! from differentiating the lowering, so a new op here needs no backward rule, no kernel and no
//! reference of its own. Adding one is a row and a `fn`; its tests go in `tests/library.rs`.

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
    /// Points the next error at the user's argument `param` (an index into the op's
    /// parameters) rather than at the value a failing core op names.
    fn blame(&mut self, _param: usize) {}
}

/// One parameter of a user-facing op: how the user writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param {
    /// A tensor expression (a number literal becomes a constant).
    Tensor(&'static str),
    /// A list of tensor expressions, `[a, b, ..]`.
    Tensors(&'static str),
    /// A number literal; `Some(default)` when it may be left out.
    Number(&'static str, Option<f64>),
    /// A non-negative integer literal; optional (the lowering picks the default).
    Size(&'static str, bool),
    /// An axis of the first tensor (or of the first tensor of the list): an integer literal,
    /// negative ones counted from the end; `true` when required.
    Axis(&'static str, bool),
    /// Axes of the first tensor: one integer literal or a list `[0, 2]`; optional (absent
    /// means every axis) unless `true`.
    Axes(&'static str, bool),
    /// `keepdim`, `true` or `false`; absent means false.
    Flag(&'static str),
    /// A list of dimensions: literals, generic parameters, symbols and their products.
    Dims(&'static str),
}

impl Param {
    pub fn name(&self) -> &'static str {
        match *self {
            Param::Tensor(n)
            | Param::Tensors(n)
            | Param::Number(n, _)
            | Param::Size(n, _)
            | Param::Axis(n, _)
            | Param::Axes(n, _)
            | Param::Flag(n)
            | Param::Dims(n) => n,
        }
    }

    pub fn required(&self) -> bool {
        match *self {
            Param::Tensor(_) | Param::Tensors(_) | Param::Dims(_) => true,
            Param::Number(_, default) => default.is_none(),
            Param::Size(_, required) | Param::Axis(_, required) | Param::Axes(_, required) => {
                required
            }
            Param::Flag(_) => false,
        }
    }
}

/// A parsed argument, in the order of the op's parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Tensor(NodeId),
    Tensors(Vec<NodeId>),
    Number(f64),
    Size(Option<usize>),
    /// Axes already resolved against the tensor's rank (non-negative, in range); `None`: absent.
    Axes(Option<Vec<usize>>),
    Flag(bool),
    Dims(Shape),
}

/// A call's arguments; the accessors name what a lowering expects at each position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args(pub Vec<Arg>);

impl Args {
    /// The form of the simple ops: tensors, then number literals.
    pub fn new(tensors: &[NodeId], numbers: &[f64]) -> Args {
        let t = tensors.iter().map(|&t| Arg::Tensor(t));
        Args(t.chain(numbers.iter().map(|&n| Arg::Number(n))).collect())
    }

    fn wrong(i: usize, what: &str) -> ShapeError {
        ShapeError::invalid(i, format!("argument {i} should be {what}"))
    }

    pub fn tensor(&self, i: usize) -> Result<NodeId, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Tensor(t)) => Ok(*t),
            _ => Err(Self::wrong(i, "a tensor")),
        }
    }

    pub fn tensors(&self, i: usize) -> Result<&[NodeId], ShapeError> {
        match self.0.get(i) {
            Some(Arg::Tensors(t)) => Ok(t),
            _ => Err(Self::wrong(i, "a list of tensors")),
        }
    }

    pub fn number(&self, i: usize) -> Result<f64, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Number(n)) => Ok(*n),
            _ => Err(Self::wrong(i, "a number")),
        }
    }

    pub fn size(&self, i: usize) -> Result<Option<usize>, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Size(n)) => Ok(*n),
            _ => Err(Self::wrong(i, "an integer")),
        }
    }

    pub fn axes(&self, i: usize) -> Result<Option<&[usize]>, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Axes(a)) => Ok(a.as_deref()),
            _ => Err(Self::wrong(i, "axes")),
        }
    }

    /// A single required axis.
    pub fn axis(&self, i: usize) -> Result<usize, ShapeError> {
        match self.axes(i)? {
            Some([a]) => Ok(*a),
            _ => Err(Self::wrong(i, "one axis")),
        }
    }

    pub fn flag(&self, i: usize) -> Result<bool, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Flag(f)) => Ok(*f),
            _ => Err(Self::wrong(i, "`keepdim`, `true` or `false`")),
        }
    }

    pub fn dims(&self, i: usize) -> Result<&Shape, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Dims(d)) => Ok(d),
            _ => Err(Self::wrong(i, "a list of dimensions")),
        }
    }
}

type Lowering = fn(&mut dyn Emit, &Args) -> Result<NodeId, ShapeError>;

/// One user-facing op.
pub struct LibraryOp {
    pub name: &'static str,
    pub params: &'static [Param],
    pub doc: &'static str,
    pub lower: Lowering,
}

impl LibraryOp {
    /// `sum(x, axes = all, keepdim = false)`: the call form for diagnostics.
    pub fn signature(&self) -> String {
        let parts: Vec<String> = self
            .params
            .iter()
            .map(|p| match *p {
                Param::Number(n, Some(d)) => format!("{n} = {d}"),
                Param::Axes(n, false) => format!("{n} = all"),
                Param::Flag(n) => format!("{n} = false"),
                Param::Tensors(n) => format!("[{n}, ..]"),
                Param::Dims(n) => format!("[{n}, ..]"),
                ref p if !p.required() => format!("{}?", p.name()),
                p => p.name().to_string(),
            })
            .collect();
        format!("{}({})", self.name, parts.join(", "))
    }
}

const fn row(
    name: &'static str,
    params: &'static [Param],
    doc: &'static str,
    lower: Lowering,
) -> LibraryOp {
    LibraryOp {
        name,
        params,
        doc,
        lower,
    }
}

use Param::{Axes, Axis, Dims, Flag, Number, Size, Tensor, Tensors};

/// The table.
pub const LIBRARY: &[LibraryOp] = &[
    // --- pointwise ----------------------------------------------------------------------------
    row(
        "relu",
        &[Tensor("x")],
        "max(x, 0); gradient 0 at 0",
        |e, a| e.op(Op::Relu, &[a.tensor(0)?]),
    ),
    row(
        "gelu",
        &[Tensor("x")],
        "x * Phi(x), the exact erf form",
        |e, a| e.op(Op::Gelu, &[a.tensor(0)?]),
    ),
    row("tanh", &[Tensor("x")], "hyperbolic tangent", |e, a| {
        e.op(Op::Tanh, &[a.tensor(0)?])
    }),
    row("sigmoid", &[Tensor("x")], "1 / (1 + exp(-x))", |e, a| {
        e.op(Op::Sigmoid, &[a.tensor(0)?])
    }),
    row("exp", &[Tensor("x")], "e^x", |e, a| {
        e.op(Op::Exp, &[a.tensor(0)?])
    }),
    row("log", &[Tensor("x")], "natural logarithm", |e, a| {
        e.op(Op::Log, &[a.tensor(0)?])
    }),
    row("sqrt", &[Tensor("x")], "square root", |e, a| {
        e.op(Op::Sqrt, &[a.tensor(0)?])
    }),
    row("neg", &[Tensor("x")], "-x", |e, a| {
        e.op(Op::Neg, &[a.tensor(0)?])
    }),
    row(
        "detach",
        &[Tensor("x")],
        "x, with no gradient flowing back through it (PyTorch's `detach`)",
        |e, a| e.op(Op::StopGradient, &[a.tensor(0)?]),
    ),
    row(
        "pow",
        &[Tensor("x"), Number("exponent", None)],
        "x^exponent",
        |e, a| {
            e.op(
                Op::PowScalar {
                    exponent: a.number(1)?,
                },
                &[a.tensor(0)?],
            )
        },
    ),
    row("silu", &[Tensor("x")], "x * sigmoid(x)", silu),
    row("abs", &[Tensor("x")], "|x|; gradient 0 at 0", abs),
    row(
        "clamp",
        &[Tensor("x"), Number("min", None), Number("max", None)],
        "x limited to [min, max]; gradient 1 inside and on the bounds",
        clamp,
    ),
    row(
        "where",
        &[Tensor("cond"), Tensor("a"), Tensor("b")],
        "a where cond is nonzero (e.g. `x > 0`), else b; all three broadcast",
        |e, a| e.op(Op::Select, &[a.tensor(0)?, a.tensor(1)?, a.tensor(2)?]),
    ),
    row(
        "softplus",
        &[Tensor("x"), Number("beta", Some(1.0))],
        "log(1 + exp(beta x)) / beta, computed without overflow",
        softplus,
    ),
    row(
        "leaky_relu",
        &[Tensor("x"), Number("negative_slope", Some(0.01))],
        "x where x > 0, else negative_slope * x",
        leaky_relu,
    ),
    row(
        "maximum",
        &[Tensor("a"), Tensor("b")],
        "elementwise larger value, broadcast; ties split the gradient",
        |e, a| e.op(Op::Maximum, &[a.tensor(0)?, a.tensor(1)?]),
    ),
    row(
        "minimum",
        &[Tensor("a"), Tensor("b")],
        "elementwise smaller value, broadcast; ties split the gradient",
        |e, a| e.op(Op::Minimum, &[a.tensor(0)?, a.tensor(1)?]),
    ),
    row(
        "dropout",
        &[Tensor("x"), Number("p", None)],
        "x * mask: each element zeroed with probability p and the rest scaled by 1/(1-p) in training; x in eval",
        dropout,
    ),
    // --- reductions and normalization ----------------------------------------------------------
    row(
        "sum",
        &[Tensor("x"), Axes("axes", false), Flag("keepdim")],
        "sum over the axes (all by default)",
        |e, a| reduce(e, a, |axes, keepdim| Op::Sum { axes, keepdim }),
    ),
    row(
        "mean",
        &[Tensor("x"), Axes("axes", false), Flag("keepdim")],
        "mean over the axes (all by default)",
        |e, a| reduce(e, a, |axes, keepdim| Op::Mean { axes, keepdim }),
    ),
    row(
        "max",
        &[Tensor("x"), Axes("axes", false), Flag("keepdim")],
        "largest element over the axes (all by default); the gradient goes to the first maximum",
        |e, a| reduce(e, a, |axes, keepdim| Op::Max { axes, keepdim }),
    ),
    row(
        "min",
        &[Tensor("x")],
        "smallest element of x (a scalar); `-max(-x)`",
        min_all,
    ),
    row(
        "softmax",
        &[Tensor("x"), Axis("axis", true)],
        "exp(x) / sum(exp(x)) along the axis, shifted by the row max",
        |e, a| softmax(e, a.tensor(0)?, a.axis(1)?, false),
    ),
    row(
        "log_softmax",
        &[Tensor("x"), Axis("axis", true)],
        "x - log(sum(exp(x))) along the axis, shifted by the row max",
        |e, a| softmax(e, a.tensor(0)?, a.axis(1)?, true),
    ),
    row(
        "layer_norm",
        &[
            Tensor("x"),
            Tensor("weight"),
            Tensor("bias"),
            Number("eps", Some(1e-5)),
        ],
        "normalizes over the last axis, then scales by weight and shifts by bias (both [D])",
        layer_norm,
    ),
    // --- losses -----------------------------------------------------------------------------------
    row(
        "mse",
        &[Tensor("a"), Tensor("b")],
        "mean of squared differences of two values of one shape, a scalar",
        mse,
    ),
    row(
        "cross_entropy",
        &[Tensor("logits"), Tensor("labels")],
        "mean over rows of -log_softmax(logits)[label]; logits [.., C], labels i64 [..]",
        cross_entropy,
    ),
    // --- contraction and windows ------------------------------------------------------------------
    row(
        "matmul",
        &[Tensor("a"), Tensor("b")],
        "[.., M, K] @ [.., K, N], batch dims broadcast",
        |e, a| e.op(Op::MatMul, &[a.tensor(0)?, a.tensor(1)?]),
    ),
    row(
        "max_pool2d",
        &[
            Tensor("x"),
            Size("kernel", true),
            Size("stride", false),
            Size("padding", false),
        ],
        "largest value of each kernel x kernel window of x [N, C, H, W]; stride = kernel, padding = 0 by default",
        |e, a| pool(e, a, true),
    ),
    row(
        "avg_pool2d",
        &[
            Tensor("x"),
            Size("kernel", true),
            Size("stride", false),
            Size("padding", false),
        ],
        "mean of each window, padding counted as zeros (PyTorch's default); stride = kernel, padding = 0 by default",
        |e, a| pool(e, a, false),
    ),
    // --- layout -----------------------------------------------------------------------------------
    row(
        "reshape",
        &[Tensor("x"), Dims("dims")],
        "the same elements in row-major order under new dimensions, e.g. `[B, 8, 8]`",
        reshape,
    ),
    row(
        "flatten",
        &[Tensor("x"), Axis("start_axis", false)],
        "merges the axes from start_axis (default 1) to the last into one",
        flatten,
    ),
    row(
        "transpose",
        &[Tensor("x"), Axis("axis_a", true), Axis("axis_b", true)],
        "swaps two axes (a view, no copy)",
        transpose,
    ),
    row(
        "permute",
        &[Tensor("x"), Axes("axes", true)],
        "reorders the axes: axis i of the result is axis axes[i] of x (a view)",
        permute,
    ),
    row(
        "concat",
        &[Tensors("parts"), Axis("axis", true)],
        "joins tensors along an axis; the other dims must agree",
        |e, a| e.op(Op::Concat { axis: a.axis(1)? }, a.tensors(0)?),
    ),
    row(
        "narrow",
        &[
            Tensor("x"),
            Axis("axis", true),
            Size("start", true),
            Size("len", true),
        ],
        "elements start..start+len along the axis (a view)",
        narrow,
    ),
];

/// The definition of `name`, if it is a library op.
pub fn lookup(name: &str) -> Option<&'static LibraryOp> {
    LIBRARY.iter().find(|op| op.name == name)
}

fn mse(e: &mut dyn Emit, args: &Args) -> Result<NodeId, ShapeError> {
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

fn cross_entropy(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
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

fn silu(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let t = [a.tensor(0)?];
    let s = e.op(Op::Sigmoid, &[t[0]])?;
    e.op(Op::Mul, &[t[0], s])
}

fn abs(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    magnitude(e, a.tensor(0)?)
}

fn magnitude(e: &mut dyn Emit, x: NodeId) -> Result<NodeId, ShapeError> {
    let t = [x];
    // maximum(x, -x): at 0 the tie splits the gradient, +1/2 - 1/2 = 0, like PyTorch.
    let n = e.op(Op::Neg, &[t[0]])?;
    e.op(Op::Maximum, &[t[0], n])
}

fn clamp(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (t, n) = ([a.tensor(0)?], [a.number(1)?, a.number(2)?]);
    // Selects rather than maximum/minimum, so a value on a bound keeps its full gradient.
    let (lo, hi) = (e.constant(n[0]), e.constant(n[1]));
    let below = e.op(Op::Compare { cmp: Cmp::Lt }, &[t[0], lo])?;
    let above = e.op(Op::Compare { cmp: Cmp::Gt }, &[t[0], hi])?;
    let upper = e.op(Op::Select, &[above, hi, t[0]])?;
    e.op(Op::Select, &[below, lo, upper])
}

fn softplus(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
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

fn leaky_relu(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (t, n) = ([a.tensor(0)?], [a.number(1)?]);
    let (zero, slope) = (e.constant(0.0), e.constant(n[0]));
    let pos = e.op(Op::Compare { cmp: Cmp::Gt }, &[t[0], zero])?;
    let scaled = e.op(Op::Mul, &[t[0], slope])?;
    e.op(Op::Select, &[pos, t[0], scaled])
}

fn min_all(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
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

fn layer_norm(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let (x, w, b) = (a.tensor(0)?, a.tensor(1)?, a.tensor(2)?);
    let n = [a.number(3)?];
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

fn dropout(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    // A mask per call: random ops are never merged, so two dropouts draw two masks.
    let mask = e
        .op(Op::DropoutMask { p: a.number(1)? }, &[x])
        .inspect_err(|_| e.blame(1))?;
    e.op(Op::Mul, &[x, mask])
}

fn reduce(
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

fn pool(e: &mut dyn Emit, a: &Args, max: bool) -> Result<NodeId, ShapeError> {
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

fn reshape(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let shape = a.dims(1)?.clone();
    // A count mismatch is about the target dims the user wrote.
    e.op(Op::Reshape { shape }, &[a.tensor(0)?])
        .inspect_err(|_| e.blame(1))
}

fn flatten(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
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

fn transpose(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let x = a.tensor(0)?;
    let mut perm: Vec<usize> = (0..e.shape(x).len()).collect();
    perm.swap(a.axis(1)?, a.axis(2)?);
    e.op(Op::Permute { perm }, &[x])
}

fn permute(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
    let perm = a.axes(1)?.unwrap_or_default().to_vec();
    e.op(Op::Permute { perm }, &[a.tensor(0)?])
        .inspect_err(|_| e.blame(1))
}

fn narrow(e: &mut dyn Emit, a: &Args) -> Result<NodeId, ShapeError> {
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
