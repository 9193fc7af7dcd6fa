//! GPU kernel sources from the fusion plan: every fused pointwise group of a `Step::Fused`
//! becomes one compute kernel in WGSL (the wgpu backend; naga translates it for Metal) and
//! in CUDA C (which builds as HIP with [`cuda::HIP_PRELUDE`] in front).
//!
//! The plan is the one the CPU code is generated from (`fusion::plan`), so a model compiled
//! once has the same groups on every target. A kernel is specialized to its body, never to
//! its shapes: the symbolic dimensions (`B`, `T`) and the inputs' layouts (a broadcast input
//! steps by 0, a transposed one by its strides) are run-time values, passed in one array of
//! `u32` words laid out as [`Meta`] says, shared by every target.
//!
//! Each pointwise op has one scalar function per target in the preludes (`rtx_<name>`, the
//! names of [`Pointwise::name`]), written to the CPU's formulas in `rtx_backends::cpu::scalar`
//! (the same rational `tanh`, the same branch-free rounding for autocast), so the GPU and CPU
//! results agree to a few ulp.

pub mod cuda;
mod gemm;
mod rows;
pub mod wgsl;

use crate::fusion::{Instr, Operand, Pointwise, Step, plan};
use crate::graph::{Graph, GraphFn, ModelIr};

/// Where a kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// WGSL for wgpu (Vulkan, Metal through naga's MSL, DX12).
    Wgsl,
    /// CUDA C for NVRTC; the same text with [`cuda::HIP_PRELUDE`] is HIP for hiprtc.
    Cuda,
}

/// One emitted kernel: its source, the entry point, and its buffer arity.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSource {
    /// Unique within a model: `{function}_{pass}_{step}` (pass `forward` or `all`).
    pub name: String,
    pub target: Target,
    /// The entry point's name in `source`.
    pub entry: String,
    pub source: String,
    /// Input buffers, in the group's input order (after the meta buffer).
    pub inputs: usize,
    /// Output buffers, written contiguously in the group's shape, in output order.
    pub outputs: usize,
    pub kind: KernelKind,
}

/// What a kernel computes, which says how it is dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// One thread per element of a `Step::Fused` group.
    Pointwise,
    /// One thread per row of a `Step::Rows` group.
    Rows,
    /// A matmul with its epilogue group in the store (WGSL): 64 x 64 tiles per workgroup;
    /// buffers meta, A, B, the group's other inputs, its outputs.
    GemmEpilogue,
    /// A `Step::MatMulEpilogue`'s group alone over the finished product (CUDA, after the
    /// vendor GEMM): dispatched as a pointwise kernel.
    Epilogue,
}

impl KernelSource {
    /// WGSL kernels enter at `main`; CUDA and HIP ones at their own (`extern "C"`) name.
    fn new(
        name: &str,
        target: Target,
        source: String,
        (inputs, outputs): (usize, usize),
        kind: KernelKind,
    ) -> Self {
        KernelSource {
            name: name.to_string(),
            target,
            entry: match target {
                Target::Wgsl => "main".to_string(),
                Target::Cuda => name.to_string(),
            },
            source,
            inputs,
            outputs,
            kind,
        }
    }
}

pub use gemm::{GEMM_TILE, gemm_epilogue};

/// Threads per workgroup (WGSL) or block (CUDA) of a fused pointwise kernel.
pub const POINTWISE_GROUP: u32 = 256;

/// Threads (one per row) per workgroup or block of a row-group kernel.
pub const ROWS_GROUP: u32 = 64;

/// The run-time words of a fused pointwise kernel, in this order:
///
/// | word | meaning |
/// |---|---|
/// | 0 | element count `n` of the group's shape |
/// | 1 | rank `r` |
/// | 2 .. 2 + r | the shape, outermost first |
/// | then, per input | its element offset, then `r` strides in elements (0 where broadcast) |
/// | then 8 words | the rounding of autocast: bias, shift, lsb, keep, smallest normal, overflow, gradient scale and its inverse (the last four as f32 bits) |
///
/// Outputs are contiguous in the group's shape. Element `i` runs on thread `i`, counted over a
/// 2-D grid (`x + y * groups_x * group size`) so that more than 65535 groups fit.
pub struct Meta;

impl Meta {
    /// Words taken by the rounding at the end.
    pub const ROUNDING_WORDS: usize = 8;

    /// The meta words of a call: `shape` of the group, and per input its offset and strides.
    pub fn words(shape: &[u32], inputs: &[(u32, Vec<u32>)], rounding: [u32; 8]) -> Vec<u32> {
        let n: u32 = shape.iter().product();
        let mut w = Vec::with_capacity(2 + shape.len() * (1 + inputs.len()) + 8);
        w.push(n);
        w.push(shape.len() as u32);
        w.extend_from_slice(shape);
        for (offset, strides) in inputs {
            w.push(*offset);
            w.extend_from_slice(strides);
        }
        w.extend_from_slice(&rounding);
        w
    }
}

/// The source of the fused pointwise group `step` for `target`, or `None` for other steps.
pub fn fused_kernel(step: &Step, name: &str, target: Target) -> Option<KernelSource> {
    let Step::Fused {
        inputs,
        body,
        outputs,
        ..
    } = step
    else {
        return None;
    };
    let source = match target {
        Target::Wgsl => wgsl::fused(inputs.len(), body, outputs),
        Target::Cuda => cuda::fused(name, inputs.len(), body, outputs),
    };
    Some(KernelSource::new(
        name,
        target,
        source,
        (inputs.len(), outputs.len()),
        KernelKind::Pointwise,
    ))
}

/// The kernel of `step` of `graph` for `target`: fused pointwise groups, row groups, and
/// matmul epilogues (in WGSL the GEMM with the group in its store, [`gemm_epilogue`],
/// buffers: meta, A, B, the group's other inputs, its outputs; in CUDA the group alone, a
/// pointwise kernel over the product that cuBLAS writes); `None` for steps the backend runs
/// with its own kernels.
pub fn kernel(graph: &Graph, step: &Step, name: &str, target: Target) -> Option<KernelSource> {
    if let Some(k) = fused_kernel(step, name, target) {
        return Some(k);
    }
    if let Step::MatMulEpilogue {
        inputs,
        body,
        outputs,
        ..
    } = step
    {
        return Some(match target {
            Target::Wgsl => KernelSource::new(
                name,
                target,
                gemm_epilogue(inputs.len(), body, outputs),
                (inputs.len() + 1, outputs.len()),
                KernelKind::GemmEpilogue,
            ),
            Target::Cuda => KernelSource::new(
                name,
                target,
                cuda::fused(name, inputs.len(), body, outputs),
                (inputs.len(), outputs.len()),
                KernelKind::Epilogue,
            ),
        });
    }
    let Step::Rows {
        shape_of,
        inputs,
        body,
        outputs,
    } = step
    else {
        return None;
    };
    let wide_shape = &graph.node(*shape_of).shape;
    // An input varies along the row unless its last axis is 1 (or it has none), as on the CPU.
    let varies: Vec<bool> = inputs
        .iter()
        .map(|&i| graph.node(i).shape.last().is_some_and(|d| !d.is_one()))
        .collect();
    let wide_out: Vec<bool> = outputs
        .iter()
        .map(|&o| &graph.node(o).shape == wide_shape)
        .collect();
    let source = match target {
        Target::Wgsl => wgsl::rows(&varies, body, outputs, &wide_out),
        Target::Cuda => cuda::rows(name, &varies, body, outputs, &wide_out),
    };
    Some(KernelSource::new(
        name,
        target,
        source,
        (inputs.len(), outputs.len()),
        KernelKind::Rows,
    ))
}

/// The two plans the compiled code runs for `f`: the forward pass alone (`forward`), and
/// the forward and backward passes together (`all`) when it has gradients.
pub fn passes(f: &GraphFn) -> Vec<(&'static str, Vec<Step>)> {
    let mut out = vec![("forward", plan(&f.graph, f.forward_len, &[f.output]))];
    if f.grads.iter().any(|g| g.grad.is_some()) {
        let mut roots = vec![f.output];
        roots.extend(f.grads.iter().filter_map(|g| g.grad));
        out.push(("all", plan(&f.graph, f.graph.len(), &roots)));
    }
    out
}

/// Every fused pointwise, row-group and matmul-epilogue kernel of every function of `ir`,
/// for `target`.
pub fn model_kernels(ir: &ModelIr, target: Target) -> Vec<KernelSource> {
    let mut out = Vec::new();
    for f in &ir.functions {
        for (pass, steps) in passes(f) {
            for (i, step) in steps.iter().enumerate() {
                let name = format!("{}_{}_{}_{}", ir.model.to_lowercase(), f.name, pass, i);
                out.extend(kernel(&f.graph, step, &name, target));
            }
        }
    }
    out
}

/// How a target spells the pieces of a body.
pub(crate) trait Spelling {
    /// The value of input `i` at the current element (a local read at the kernel's start).
    fn input(&self, i: usize) -> String {
        format!("x{i}")
    }
    fn node(&self, n: usize) -> String {
        format!("v{n}")
    }
    /// A finite f32 literal; infinities and NaN as bit patterns.
    fn literal(&self, value: f32) -> String;
    /// `let`/`const float` for a local of the body.
    fn bind(&self, name: &str, value: &str) -> String;
    /// The rounding parameter's name passed to autocast.
    fn rounding(&self) -> &'static str {
        "rounding"
    }
}

/// The statements of `body`, one local per instruction.
pub(crate) fn body_lines(s: &dyn Spelling, body: &[Instr]) -> Vec<String> {
    body.iter()
        .map(|ins| {
            let args: Vec<String> = ins
                .args
                .iter()
                .map(|a| match *a {
                    Operand::Input(i) => s.input(i),
                    Operand::Node(n) => s.node(n),
                    Operand::Const(c) => s.literal(c as f32),
                    // Pointwise groups have no row; a row group is not emitted here.
                    Operand::RowLen => s.literal(0.0),
                })
                .collect();
            let value = call(s, ins.op, &args);
            s.bind(&s.node(ins.node), &value)
        })
        .collect()
}

pub(crate) fn call(s: &dyn Spelling, op: Pointwise, args: &[String]) -> String {
    let name = op.name();
    match op {
        Pointwise::Autocast | Pointwise::AutocastGrad => {
            format!("rtx_{name}({}, {})", args[0], s.rounding())
        }
        Pointwise::Pow(p) => pow(s, &args[0], p),
        _ => format!("rtx_{name}({})", args.join(", ")),
    }
}

/// `x^p` as the CPU's `powf` gives it: exact squares and square roots, and a negative base
/// with an integer exponent keeps its sign rule (GPU `pow` is `exp2(p * log2(x))`, undefined
/// below zero).
fn pow(s: &dyn Spelling, x: &str, p: f64) -> String {
    if p == 1.0 {
        x.to_string()
    } else if p == 2.0 {
        format!("({x} * {x})")
    } else if p == 0.5 {
        format!("rtx_sqrt({x})")
    } else if p.fract() == 0.0 && p.abs() < 16_777_216.0 {
        let odd = (p as i64) % 2 != 0;
        format!("rtx_pow_int({x}, {}, {odd})", s.literal(p as f32))
    } else {
        format!("rtx_pow({x}, {})", s.literal(p as f32))
    }
}

/// An f32 literal in the shared decimal syntax of WGSL and C (`1.5`, `1e-30`), or `None`
/// for infinities and NaN, which each target writes as a bit pattern.
pub(crate) fn decimal(value: f32) -> Option<String> {
    if !value.is_finite() {
        return None;
    }
    let s = format!("{value:?}");
    Some(if s.contains(['.', 'e']) {
        s
    } else {
        format!("{s}.0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_literals_always_read_as_floats() {
        assert_eq!(decimal(1.0).as_deref(), Some("1.0"));
        assert_eq!(decimal(-1e30).as_deref(), Some("-1e30"));
        assert_eq!(decimal(0.5).as_deref(), Some("0.5"));
        assert_eq!(decimal(f32::INFINITY), None);
    }

    #[test]
    fn meta_words_follow_the_documented_layout() {
        let w = Meta::words(&[2, 3], &[(5, vec![3, 1]), (0, vec![0, 1])], [9; 8]);
        assert_eq!(&w[..4], &[6, 2, 2, 3]);
        assert_eq!(&w[4..10], &[5, 3, 1, 0, 0, 1]);
        assert_eq!(&w[10..], &[9; 8]);
    }
}
