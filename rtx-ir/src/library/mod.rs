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

//!
//! Files: this one holds the table and what a lowering builds with (`Emit`); `args.rs` the
//! parameter kinds and parsed arguments; `lowerings.rs` the lowerings longer than a line.

mod args;
mod lowerings;

pub use args::{Arg, Args, Param};
pub use lowerings::{autocast_product, rounded, softmax};

use crate::graph::NodeId;
use crate::infer::ShapeError;
use crate::op::{DType, Op, Shape};
use lowerings::*;

/// What a lowering builds with: core ops over earlier values, with shape rules checked.
pub trait Emit {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError>;
    /// A scalar constant, broadcast by the op that uses it.
    fn constant(&mut self, value: f64) -> NodeId;
    fn shape(&self, value: NodeId) -> &Shape;
    fn dtype(&self, value: NodeId) -> DType;
    /// Whether two shapes are equal, as a shape rule decides it: a dimension that depends on a
    /// generic parameter may be left for rustc to check (an obligation), as in core rules.
    fn same_shape(&mut self, expected: &Shape, found: &Shape) -> bool;
    /// Points the next error at the user's argument `param` (an index into the op's
    /// parameters) rather than at the value a failing core op names.
    fn blame(&mut self, _param: usize) {}
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
    row(
        "gelu_tanh",
        &[Tensor("x")],
        "the tanh approximation of gelu, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's `approximate='tanh'`, GPT-2's); a core op, whose backward reads only x",
        |e, a| e.op(Op::GeluTanh, &[a.tensor(0)?]),
    ),
    row("sin", &[Tensor("x")], "sine (radians)", |e, a| {
        e.op(Op::Sin, &[a.tensor(0)?])
    }),
    row("cos", &[Tensor("x")], "cosine (radians)", |e, a| {
        e.op(Op::Cos, &[a.tensor(0)?])
    }),
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
        "tril",
        &[Tensor("x"), Number("diagonal", Some(0.0))],
        "x's last two axes kept on and below the diagonal (column <= row + diagonal), zero above: a causal mask is `tril(ones)`",
        |e, a| triangle(e, a, true),
    ),
    row(
        "triu",
        &[Tensor("x"), Number("diagonal", Some(0.0))],
        "x's last two axes kept on and above the diagonal (column >= row + diagonal), zero below",
        |e, a| triangle(e, a, false),
    ),
    row(
        "masked_fill",
        &[Tensor("x"), Tensor("mask"), Number("value", None)],
        "x with `value` where mask is nonzero (mask broadcasts to x, e.g. a causal mask); no gradient to the filled places",
        masked_fill,
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
        "positions",
        &[Tensor("x"), Axis("axis", true)],
        "i64 [n]: 0, 1, .., n - 1 for x's n places along the axis; `self.wpe(positions(idx, 1))` is a learned position embedding",
        |e, a| e.op(Op::Positions { axis: a.axis(1)? }, &[a.tensor(0)?]),
    ),
    row(
        "argmax",
        &[Tensor("x"), Axis("axis", true)],
        "i64 position of the largest value along the axis, which is removed (the first on ties); no gradient",
        |e, a| e.op(Op::ArgMax { axis: a.axis(1)? }, &[a.tensor(0)?]),
    ),
    row(
        "top_k",
        &[Tensor("x"), Size("k", true)],
        "the k largest values along the last axis, largest first (a NaN counts as the largest; equal values keep their order); the gradient goes to the positions they came from",
        |e, a| {
            let k = top_k_count(a)?;
            e.op(Op::TopK { k }, &[a.tensor(0)?])
        },
    ),
    row(
        "top_k_indices",
        &[Tensor("x"), Size("k", true)],
        "i64 positions along the last axis of what `top_k(x, k)` returns; no gradient",
        |e, a| {
            let k = top_k_count(a)?;
            e.op(Op::TopKIndices { k }, &[a.tensor(0)?])
        },
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
    row(
        "rms_norm",
        &[Tensor("x"), Tensor("weight"), Number("eps", Some(1e-6))],
        "x / sqrt(mean(x^2) + eps) over the last axis, scaled by weight ([D]); no centering",
        rms_norm,
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
        |e, a| autocast_product(e, Op::MatMul, &[a.tensor(0)?, a.tensor(1)?]),
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
        "the same elements in row-major order under new dimensions, e.g. `[B, 8, 8]`; one of them may be -1, inferred from the element count",
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
        "rope",
        &[Tensor("x"), Number("base", Some(10000.0))],
        "rotary position embedding of x [.., T, D] (D even, literal), position t turning each pair (x[i], x[i + D/2]) by t * base^(-2i/D) (the `rotate_half` form of GPT-NeoX and LLaMA)",
        rope,
    ),
    row(
        "attention",
        &[Tensor("q"), Tensor("k"), Tensor("v"), Flag("causal")],
        "softmax(q k^T / sqrt(D)) v over [.., T, D] (PyTorch's scaled_dot_product_attention); `causal = true` hides later keys",
        attention,
    ),
    row(
        "split_heads",
        &[Tensor("x"), Size("heads", true)],
        "[.., T, C] -> [.., heads, T, C / heads] (a reshape and a view); heads must divide C",
        split_heads,
    ),
    row(
        "merge_heads",
        &[Tensor("x")],
        "[.., H, T, D] -> [.., T, H * D], undoing split_heads",
        merge_heads,
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

/// The `k` of `top_k(x, k)`, which must be written as a number.
fn top_k_count(a: &Args) -> Result<usize, ShapeError> {
    a.size(1)?
        .ok_or_else(|| ShapeError::invalid(1, "top_k needs k as an integer literal".to_string()))
}
