//! The op table: every op the IR knows, defined once.
//!
//! Each op has one row here (its name, arity, kind and cost), one shape rule in `infer.rs`, one
//! backward rule in `autodiff.rs` and one float64 reference in `reference.rs`. The macro, the
//! IR executor and the CPU kernels all dispatch on this enum, so an op cannot mean two things.
//!
//! Ops whose result shape depends on another value's shape take that value as an extra
//! argument (a "shape witness", e.g. `SumTo(g, like)`), so a backward graph over symbolic
//! dimensions needs no shapes baked into its ops.

use crate::dim::Dim;
use serde::{Deserialize, Serialize};

pub type Shape = Vec<Dim>;

/// Element type of a value in the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    I64,
}

/// The comparison of `Op::Compare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Cmp {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl Cmp {
    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
        }
    }
}

/// The precision a graph call computes its products at: what `Op::Autocast` rounds to.
///
/// Mixed precision in rtx follows PyTorch's autocast: parameters stay f32 (the master
/// weights the optimizer updates), and every operand and result of a matmul, linear,
/// convolution and attention is rounded to the low-precision type, with f32 accumulation
/// inside; normalization, softmax, losses and the residual stream stay f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Precision {
    #[default]
    F32,
    /// bfloat16: 8 exponent bits (f32's range), 8 significant bits.
    Bf16,
    /// IEEE half: 5 exponent bits (largest finite 65504, smallest normal 2^-14), 11
    /// significant bits; gradients need loss scaling to stay in range.
    F16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// Parses `f32`, `bf16` or `f16`.
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            "f16" => Some(Precision::F16),
            _ => None,
        }
    }
}

/// What `Autocast` and `AutocastGrad` do in one call: the precision, and the loss scale
/// (a power of two) that gradients are multiplied by before they are rounded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutocastMode {
    pub precision: Precision,
    pub loss_scale: f32,
}

impl AutocastMode {
    /// f32 throughout: both ops are the identity.
    pub const OFF: AutocastMode = AutocastMode {
        precision: Precision::F32,
        loss_scale: 1.0,
    };
}

impl Default for AutocastMode {
    fn default() -> Self {
        AutocastMode::OFF
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // --- leaves --------------------------------------------------------------------------
    /// The `index`-th argument of the graph function.
    Input {
        index: usize,
        name: String,
        shape: Shape,
        dtype: DType,
    },
    /// A model parameter by its dotted name (`fc1.weight`).
    Param {
        name: String,
        shape: Shape,
    },
    /// A scalar constant (shape `[]`), broadcast by the op that uses it.
    Const {
        value: f64,
    },

    // --- elementwise ---------------------------------------------------------------------
    /// `x` rounded to the nearest value of the call's precision (`AutocastMode`; round to
    /// nearest even, overflow to infinity), kept in f32: the identity at f32. The lowering
    /// puts it on the operands and results of products (see `Precision`).
    Autocast,
    /// The identity, through which no gradient flows (`detach`, JAX's `stop_gradient`):
    /// softmax's row max is shifted out without a gradient, as it cancels exactly.
    StopGradient,
    Neg,
    Relu,
    Gelu,
    /// GELU's tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
    /// (PyTorch's `approximate='tanh'`, GPT-2's).
    GeluTanh,
    Tanh,
    Sin,
    Cos,
    Sigmoid,
    Exp,
    Log,
    Sqrt,
    PowScalar {
        exponent: f64,
    },
    Add,
    Sub,
    Mul,
    Div,
    /// Elementwise larger of two values; NaN propagates, like `torch.maximum`.
    Maximum,
    /// Elementwise smaller of two values; NaN propagates, like `torch.minimum`.
    Minimum,
    /// `(a, b) -> 1.0 where the comparison holds, else 0.0`. Has no gradient.
    Compare {
        cmp: Cmp,
    },
    /// `(cond, a, b) -> a where cond != 0, else b`, all three broadcast.
    Select,

    // --- reductions ----------------------------------------------------------------------
    Sum {
        axes: Vec<usize>,
        keepdim: bool,
    },
    Mean {
        axes: Vec<usize>,
        keepdim: bool,
    },
    Max {
        axes: Vec<usize>,
        keepdim: bool,
    },

    // --- linear algebra, nn ----------------------------------------------------------------
    /// `[.., M, K] @ [.., K, N]`, batch dimensions broadcast.
    MatMul,
    /// `(q [.., Tq, D], k [.., Tk, D], v [.., Tk, Dv]) -> [.., Tq, Dv]`:
    /// `softmax(q k^T / sqrt(D)) v` with equal batch axes; with `causal` (Tq == Tk), key `j`
    /// is hidden from query `i` when `j > i`. Flash-style: an online softmax over blocks of
    /// keys, no `[Tq, Tk]` matrix stored.
    Attention {
        causal: bool,
    },
    /// `(x [N, C, H, W], w [O, C, KH, KW]) -> [N, O, OH, OW]`.
    Conv2d {
        stride: [usize; 2],
        padding: [usize; 2],
    },
    MaxPool2d {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    AvgPool2d {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// `(table [V, D], ids [..] i64) -> [.., D]`.
    Embedding,
    /// `(x [.., C], ids [..] i64) -> [..]`: one element of each last-axis row, `x[.., ids[..]]`
    /// (PyTorch's `gather` along the last axis, squeezed); ids outside `0..C` are an error.
    /// `cross_entropy` picks each row's label with it.
    Pick,
    /// `(x) -> mask` of x's shape: 0 with probability p, else 1/(1-p); ones in eval mode.
    DropoutMask {
        p: f64,
    },
    /// `(x) -> positions`: 0, 1, .. along `axis`, with x's rank and size 1 on every other axis
    /// (so it broadcasts against x); depends on x's shape only. Masks (`tril`, `triu`) compare
    /// two of these.
    Iota {
        axis: usize,
    },
    /// `(x) -> i64 [n]`: 0, 1, .., n - 1 where n is x's size along `axis` (the positions of a
    /// sequence, for a position-embedding table); depends on x's shape only.
    Positions {
        axis: usize,
    },
    /// `(x) -> i64 indices`: the position of the largest value along `axis`, which is removed
    /// (the first on ties; a NaN counts as the largest, as in PyTorch). No gradient.
    ArgMax {
        axis: usize,
    },
    /// `(x [.., n]) -> [.., k]`: the `k` largest values along the last axis, largest first (a
    /// NaN counts as the largest; equal values keep their order), as `torch.topk(x, k).values`.
    TopK {
        k: usize,
    },
    /// `(x [.., n]) -> i64 [.., k]`: the positions `TopK` took its values from. No gradient.
    TopKIndices {
        k: usize,
    },

    // --- layout ----------------------------------------------------------------------------
    Reshape {
        shape: Shape,
    },
    Permute {
        perm: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    Narrow {
        axis: usize,
        start: usize,
        len: usize,
    },
    /// `(x, like) -> x` broadcast to `like`'s shape.
    BroadcastTo,

    // --- backward-only ops -----------------------------------------------------------------
    /// The backward of `Autocast`: `g` stored at the call's precision, as the gradient of a
    /// half-precision value is. With loss scale `S` it is `round(g * S) / S`: a gradient
    /// scaled by `S` from the loss down (every vector-Jacobian product is linear in `g`, and
    /// a power of two scales f32 exactly) differs from an unscaled one only where it is
    /// rounded, so the scale is applied there and the gradients come out unscaled. An
    /// overflow is an infinity in the gradients, which `LossScaler` detects.
    AutocastGrad,
    /// `(g, like) -> g` summed down to `like`'s shape (inverse of broadcasting).
    SumTo,
    /// `(x, g) -> g * (x > 0)`.
    ReluGrad,
    /// `(x, g) -> g * gelu'(x)`.
    GeluGrad,
    /// `(x, g) -> g * gelu_tanh'(x)`.
    GeluTanhGrad,
    /// `(x_like, g) -> x-shaped`: g broadcast back over `axes` and divided by their count.
    MeanGrad {
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// `(x, g) -> x-shaped`, g routed to the first maximum of each group.
    MaxGrad {
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// `(g [..], ids [..], x_like [.., C]) -> x-shaped`: zeros with `g` at the picked positions.
    PickGrad,
    /// `(g, w, x_like) -> x-shaped`.
    Conv2dGradInput {
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// `(x, g, w_like) -> w-shaped`.
    Conv2dGradWeight {
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// `(x, g) -> x-shaped`.
    MaxPool2dGrad {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// `(x_like, g) -> x-shaped`.
    AvgPool2dGrad {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// `(g, full_like) -> full-shaped`, g placed at `start..` on `axis`, zeros elsewhere.
    PadNarrow {
        axis: usize,
        start: usize,
    },
    /// `(g, ids, table_like) -> table-shaped`, rows of g added at ids.
    EmbeddingGrad,
    /// `(x, g) -> x-shaped`: zeros with each row's `g` at the positions `TopK` chose.
    TopKGrad {
        k: usize,
    },
    /// `(q, k, v, g) -> [3, ..q]`: the gradients of `Attention` for q, k and v (one shape),
    /// stacked; each query row's weights are recomputed, not saved.
    AttentionGrad {
        causal: bool,
    },
    /// `(g, part_0, .., part_n) -> part_index-shaped`: the slice of `g` along `axis` that
    /// `part_index` occupied in `concat(part_0, .., part_n)`. The parts are shape witnesses,
    /// so the slice bounds may be symbolic.
    ConcatGrad {
        axis: usize,
        index: usize,
    },
}

/// How an op touches memory; the fusion planner and the cost model read this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Leaf,
    Elementwise,
    Reduction,
    Contraction,
    Layout,
    Other,
}

/// The static row of the table.
#[derive(Clone, Copy, Debug)]
pub struct OpDef {
    pub name: &'static str,
    /// Number of arguments.
    pub arity: usize,
    pub kind: OpKind,
    /// Floating-point operations per output element (contractions: per multiply-add of the
    /// contracted dimension, see `Op::cost`).
    pub flops_per_element: f64,
}

const fn def(name: &'static str, arity: usize, kind: OpKind, flops_per_element: f64) -> OpDef {
    OpDef {
        name,
        arity,
        kind,
        flops_per_element,
    }
}

use OpKind::*;

impl Op {
    /// The op table.
    pub fn def(&self) -> OpDef {
        match self {
            Op::Input { .. } => def("input", 0, Leaf, 0.0),
            Op::Param { .. } => def("param", 0, Leaf, 0.0),
            Op::Const { .. } => def("const", 0, Leaf, 0.0),
            Op::StopGradient => def("stop_gradient", 1, Elementwise, 0.0),
            Op::Autocast => def("autocast", 1, Elementwise, 1.0),
            Op::AutocastGrad => def("autocast_grad", 1, Elementwise, 2.0),
            Op::Neg => def("neg", 1, Elementwise, 1.0),
            Op::Relu => def("relu", 1, Elementwise, 1.0),
            Op::Gelu => def("gelu", 1, Elementwise, 20.0),
            Op::GeluTanh => def("gelu_tanh", 1, Elementwise, 20.0),
            Op::Tanh => def("tanh", 1, Elementwise, 20.0),
            Op::Sin => def("sin", 1, Elementwise, 20.0),
            Op::Cos => def("cos", 1, Elementwise, 20.0),
            Op::Sigmoid => def("sigmoid", 1, Elementwise, 20.0),
            Op::Exp => def("exp", 1, Elementwise, 20.0),
            Op::Log => def("log", 1, Elementwise, 20.0),
            Op::Sqrt => def("sqrt", 1, Elementwise, 4.0),
            Op::PowScalar { .. } => def("pow", 1, Elementwise, 20.0),
            Op::Add => def("add", 2, Elementwise, 1.0),
            Op::Sub => def("sub", 2, Elementwise, 1.0),
            Op::Mul => def("mul", 2, Elementwise, 1.0),
            Op::Div => def("div", 2, Elementwise, 1.0),
            Op::Maximum => def("maximum", 2, Elementwise, 1.0),
            Op::Minimum => def("minimum", 2, Elementwise, 1.0),
            Op::Compare { .. } => def("compare", 2, Elementwise, 1.0),
            Op::Select => def("select", 3, Elementwise, 1.0),
            Op::Sum { .. } => def("sum", 1, Reduction, 1.0),
            Op::Mean { .. } => def("mean", 1, Reduction, 1.0),
            Op::Max { .. } => def("max", 1, Reduction, 1.0),
            Op::MatMul => def("matmul", 2, Contraction, 2.0),
            Op::Attention { .. } => def("attention", 3, Other, 4.0),
            Op::Conv2d { .. } => def("conv2d", 2, Contraction, 2.0),
            Op::MaxPool2d { .. } => def("max_pool2d", 1, Other, 1.0),
            Op::AvgPool2d { .. } => def("avg_pool2d", 1, Other, 1.0),
            Op::Embedding => def("embedding", 2, Other, 0.0),
            Op::Pick => def("pick", 2, Other, 0.0),
            Op::DropoutMask { .. } => def("dropout_mask", 1, Elementwise, 5.0),
            Op::Iota { .. } => def("iota", 1, Other, 0.0),
            Op::ArgMax { .. } => def("argmax", 1, Other, 1.0),
            Op::TopK { .. } => def("top_k", 1, Other, 4.0),
            Op::TopKIndices { .. } => def("top_k_indices", 1, Other, 4.0),
            Op::Positions { .. } => def("positions", 1, Other, 0.0),
            Op::Reshape { .. } => def("reshape", 1, Layout, 0.0),
            Op::Permute { .. } => def("permute", 1, Layout, 0.0),
            Op::Concat { .. } => def("concat", usize::MAX, Layout, 0.0),
            Op::Narrow { .. } => def("narrow", 1, Layout, 0.0),
            Op::BroadcastTo => def("broadcast_to", 2, Layout, 0.0),
            Op::SumTo => def("sum_to", 2, Reduction, 1.0),
            Op::ReluGrad => def("relu_grad", 2, Elementwise, 1.0),
            Op::GeluGrad => def("gelu_grad", 2, Elementwise, 30.0),
            Op::GeluTanhGrad => def("gelu_tanh_grad", 2, Elementwise, 30.0),
            Op::MeanGrad { .. } => def("mean_grad", 2, Elementwise, 1.0),
            Op::MaxGrad { .. } => def("max_grad", 2, Reduction, 2.0),
            Op::PickGrad => def("pick_grad", 3, Other, 1.0),
            Op::Conv2dGradInput { .. } => def("conv2d_grad_input", 3, Contraction, 2.0),
            Op::Conv2dGradWeight { .. } => def("conv2d_grad_weight", 3, Contraction, 2.0),
            Op::MaxPool2dGrad { .. } => def("max_pool2d_grad", 2, Other, 1.0),
            Op::AvgPool2dGrad { .. } => def("avg_pool2d_grad", 2, Other, 1.0),
            Op::PadNarrow { .. } => def("pad_narrow", 2, Layout, 0.0),
            Op::EmbeddingGrad => def("embedding_grad", 3, Other, 1.0),
            Op::ConcatGrad { .. } => def("concat_grad", usize::MAX, Layout, 0.0),
            Op::AttentionGrad { .. } => def("attention_grad", 4, Other, 10.0),
            Op::TopKGrad { .. } => def("top_k_grad", 2, Other, 4.0),
        }
    }

    pub fn name(&self) -> &'static str {
        self.def().name
    }

    /// Ops that draw random numbers: two calls are two draws, so they are never merged as
    /// common subexpressions and their outputs have no gradient.
    pub fn is_random(&self) -> bool {
        matches!(self, Op::DropoutMask { .. })
    }

    /// Rough floating-point operation count, given the output element count and, for
    /// contractions, the contracted length (K of a matmul, C*KH*KW of a conv).
    pub fn cost(&self, out_elements: f64, contracted: f64) -> f64 {
        let d = self.def();
        match d.kind {
            Contraction => d.flops_per_element * out_elements * contracted,
            _ => d.flops_per_element * out_elements,
        }
    }
}
