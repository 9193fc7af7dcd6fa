//! Executes one IR op on tensors: the single dispatch point from `rtx_ir::Op` to the kernels.
//!
//! The code `graph!` emits calls `run_op` once per node, and the IR executor (`exec.rs`) calls
//! it too, so compiled models and interpreted graphs cannot disagree. Every call first runs the
//! op's shape rule from `rtx-ir` on the concrete shapes, so kernels only ever see valid input
//! (they still check what they need to be memory-safe, and their `KernelError` becomes an
//! `RtxError` here).

use crate::ctx::Ctx;
use crate::error::{Result, RtxError};
use crate::tensor::{Buffer, DType, Tensor};
use rtx_backends::Layout;
use rtx_backends::arena::Region;
use rtx_backends::cpu::{self, BinaryOp, ReduceOp, UnaryOp};
use rtx_ir::{Cmp, Dim, Op, ShapeErrorKind, Unifier};

fn ir_shape(s: &[usize]) -> rtx_ir::Shape {
    s.iter().map(|&d| Dim::known(d)).collect()
}

fn ir_dtype(t: &Tensor) -> rtx_ir::DType {
    match t.dtype() {
        // A half tensor passes the shape rule as a float; its kernel then refuses it by name
        // (`Tensor::f32_parts`): the f32 kernels do not read bf16 or f16.
        DType::F32 | DType::BF16 | DType::F16 => rtx_ir::DType::F32,
        DType::I64 => rtx_ir::DType::I64,
    }
}

/// Runs the op's shape rule on concrete shapes; returns the output shape.
pub fn check_shapes(op: &Op, args: &[&Tensor]) -> Result<Vec<usize>> {
    let shapes: Vec<rtx_ir::Shape> = args.iter().map(|t| ir_shape(t.shape())).collect();
    let info: Vec<(&rtx_ir::Shape, rtx_ir::DType)> = shapes
        .iter()
        .zip(args)
        .map(|(s, t)| (s, ir_dtype(t)))
        .collect();
    let mut u = Unifier::default();
    match rtx_ir::infer(op, &info, &mut u) {
        Ok((shape, _)) => shape
            .iter()
            .map(|d| d.as_known())
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                RtxError::Invalid(format!("{}: output shape is not concrete", op.name()))
            }),
        Err(e) => Err(match e.kind {
            ShapeErrorKind::Mismatch {
                expected, found, ..
            } => RtxError::ShapeMismatch {
                context: format!("`{}` argument {}", op.name(), e.arg),
                expected: rtx_ir::fmt_shape(&expected),
                found: rtx_ir::fmt_shape(&found),
            },
            _ => RtxError::Invalid(format!("{}: {}", op.name(), e)),
        }),
    }
}

fn f32s<'a>(t: &'a Tensor, op: &Op) -> Result<(&'a [f32], &'a Layout)> {
    t.f32_parts(op.name())
}

fn unary(op: &Op, x: &Tensor, u: UnaryOp) -> Result<Tensor> {
    let (d, l) = f32s(x, op)?;
    Ok(Tensor::from_kernel(cpu::unary(u, d, l)?, x.shape()))
}

fn binary(op: &Op, a: &Tensor, b: &Tensor, k: BinaryOp) -> Result<Tensor> {
    let ((da, la), (db, lb)) = (f32s(a, op)?, f32s(b, op)?);
    let (out, shape) = cpu::binary(k, da, la, db, lb)?;
    Ok(Tensor::from_kernel(out, &shape))
}

fn reduce(op: &Op, x: &Tensor, k: ReduceOp, axes: &[usize], keepdim: bool) -> Result<Tensor> {
    let (d, l) = f32s(x, op)?;
    let (out, shape) = cpu::reduce(k, d, l, axes, keepdim)?;
    Ok(Tensor::from_kernel(out, &shape))
}

/// `g` laid out with the reduced axes reinserted as size 1, then broadcast to `shape`.
fn unreduce_layout(g: &Layout, shape: &[usize], axes: &[usize], keepdim: bool) -> Layout {
    let mut l = g.clone();
    if !keepdim {
        let mut s = rtx_backends::layout::Dims::new();
        let mut st = rtx_backends::layout::Dims::new();
        let mut j = 0;
        for i in 0..shape.len() {
            if axes.contains(&i) {
                s.push(1);
                st.push(0);
            } else {
                s.push(g.shape[j]);
                st.push(g.strides[j]);
                j += 1;
            }
        }
        l = Layout {
            shape: s,
            strides: st,
            offset: g.offset,
        };
    }
    l.broadcast_to(shape)
}

/// Executes `op` on `args`. Leaves (`Input`, `Param`) are bound by the caller, not here.
pub fn run_op(op: &Op, args: &[&Tensor], ctx: &mut Ctx) -> Result<Tensor> {
    // An eager op from the main thread forks its kernel in place rather than handing it to
    // a pool it is not part of (see `parallel::join_pool_from_main`).
    crate::parallel::join_pool_from_main();
    let out_shape = check_shapes(op, args)?;
    check_size(op, args, &out_shape)?;
    if let Some(on_device) = crate::gpu::run_op_on(op, args, &out_shape, ctx) {
        return on_device;
    }
    execute(op, args, &out_shape, ctx)
}

/// The most bytes one op may ask for (its output plus its largest workspace): 32 GiB. A
/// graph read from a file can ask for anything, and Rust aborts the process when an
/// allocation fails, so an absurd request is refused here instead.
pub const MAX_OP_BYTES: u128 = 32 << 30;

/// Refuses ops whose output (or, for convolutions, the unfolded input) would exceed
/// `MAX_OP_BYTES`.
fn check_size(op: &Op, args: &[&Tensor], out_shape: &[usize]) -> Result<()> {
    let elements = |dims: &[usize]| dims.iter().fold(1u128, |n, &d| n.saturating_mul(d as u128));
    let mut requested = elements(out_shape);
    if let Op::Conv2d { .. } | Op::Conv2dGradInput { .. } | Op::Conv2dGradWeight { .. } = op {
        // im2col holds C * KH * KW values per output pixel of every image.
        let x = if matches!(op, Op::Conv2dGradInput { .. }) {
            args[2]
        } else {
            args[0]
        };
        let w = if matches!(op, Op::Conv2dGradWeight { .. }) {
            args[2]
        } else {
            args[1]
        };
        let (xs, ws) = (x.shape(), w.shape());
        let pixels = match op {
            Op::Conv2dGradInput { .. } | Op::Conv2dGradWeight { .. } => {
                elements(&args[1].shape()[2..]).saturating_mul(xs[0] as u128)
            }
            _ => elements(&out_shape[2..]).saturating_mul(out_shape[0] as u128),
        };
        requested = requested.max(elements(&ws[1..]).saturating_mul(pixels));
    }
    let bytes = requested.saturating_mul(4);
    if bytes > MAX_OP_BYTES {
        return Err(RtxError::OutOfMemory {
            context: format!("`{}`", op.name()),
            requested: bytes,
            limit: MAX_OP_BYTES,
        });
    }
    Ok(())
}

/// [`execute`], writing the output of the kernels that take a given buffer (a compiled
/// call's arena `region`; `rtx_ir::memory::kernel_writes_into` lists them) into it. A region
/// of the wrong length is not used: the output then comes from the buffer cache.
#[doc(hidden)]
pub fn execute_into(
    op: &Op,
    args: &[&Tensor],
    out_shape: &[usize],
    region: Option<Region>,
    ctx: &mut Ctx,
) -> Result<Tensor> {
    let a = |i: usize| args[i];
    let planned = region.is_some();
    let buffer = |len| Buffer::new(region, len);
    let (out, shape) = match op {
        Op::MatMul => {
            let ((da, la), (db, lb)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            cpu::matmul_into(da, la, db, lb, buffer)?
        }
        Op::Attention { causal } => {
            let (q, k, v) = (f32s(a(0), op)?, f32s(a(1), op)?, f32s(a(2), op)?);
            cpu::attention_into(q, k, v, *causal, buffer)?
        }
        Op::AttentionGrad { causal } => {
            let (q, k, v) = (f32s(a(0), op)?, f32s(a(1), op)?, f32s(a(2), op)?);
            cpu::attention_grad_into(q, k, v, f32s(a(3), op)?, *causal, buffer)?
        }
        Op::Reshape { .. } if planned && a(0).dtype() == DType::F32 => {
            let t = a(0);
            if t.layout().is_contiguous() && t.layout().offset == 0 {
                // Row-major already: the reshape is a view, the region goes back unused.
                return execute(op, args, out_shape, ctx);
            }
            crate::tensor::check_len(t.numel(), out_shape, "reshape")?;
            let (d, l) = f32s(t, op)?;
            let mut out = buffer(t.numel());
            cpu::to_contiguous_into(d, l, out.as_mut_slice())?;
            (out, out_shape.into())
        }
        // The region, if any, goes back unused (the arena plan places only the ops above).
        _ => return execute(op, args, out_shape, ctx),
    };
    Ok(Tensor::from_buffer(out, &shape))
}

/// Executes `op` on arguments whose shapes already passed its shape rule, with the output
/// shape that rule gives. Compiled models call this: the macro ran the shape rules at compile
/// time and the generated code checked inputs and parameters on entry, so no shape rule runs
/// per node. The kernels still check what they need to be memory-safe (layouts inside their
/// buffers, operands that combine, indices in range, a few comparisons each) and an argument
/// they refuse is an `RtxError`. The IR's rules stay the source of truth: arguments that did
/// not pass them may still give a meaningless result instead of the rule's error, and this
/// function's own reads of them (the argument count, view ops such as `Permute`, sizes taken
/// from another argument's shape) may panic.
#[doc(hidden)]
pub fn execute(op: &Op, args: &[&Tensor], out_shape: &[usize], ctx: &mut Ctx) -> Result<Tensor> {
    let a = |i: usize| args[i];
    Ok(match op {
        Op::Input { name, .. } => {
            return Err(RtxError::Invalid(format!(
                "input `{name}` must be bound by the caller"
            )));
        }
        Op::Param { name, .. } => {
            return Err(RtxError::Invalid(format!(
                "parameter `{name}` must be bound by the caller"
            )));
        }
        Op::Const { value } => Tensor::scalar(*value as f32),
        Op::StopGradient => a(0).clone(),
        Op::Autocast | Op::AutocastGrad if ctx.precision() == rtx_ir::Precision::F32 => {
            a(0).clone()
        }
        Op::Autocast => unary(op, a(0), UnaryOp::Autocast(ctx.rounding()))?,
        Op::AutocastGrad => unary(op, a(0), UnaryOp::AutocastGrad(ctx.rounding()))?,
        Op::Neg => unary(op, a(0), UnaryOp::Neg)?,
        Op::Relu => unary(op, a(0), UnaryOp::Relu)?,
        Op::Gelu => unary(op, a(0), UnaryOp::Gelu)?,
        Op::GeluTanh => unary(op, a(0), UnaryOp::GeluTanh)?,
        Op::Tanh => unary(op, a(0), UnaryOp::Tanh)?,
        Op::Sin => unary(op, a(0), UnaryOp::Sin)?,
        Op::Cos => unary(op, a(0), UnaryOp::Cos)?,
        Op::Sigmoid => unary(op, a(0), UnaryOp::Sigmoid)?,
        Op::Exp => unary(op, a(0), UnaryOp::Exp)?,
        Op::Log => unary(op, a(0), UnaryOp::Log)?,
        Op::Sqrt => unary(op, a(0), UnaryOp::Sqrt)?,
        Op::PowScalar { exponent } => unary(op, a(0), UnaryOp::PowScalar(*exponent as f32))?,
        Op::Add => binary(op, a(0), a(1), BinaryOp::Add)?,
        Op::Sub => binary(op, a(0), a(1), BinaryOp::Sub)?,
        Op::Mul => binary(op, a(0), a(1), BinaryOp::Mul)?,
        Op::Div => binary(op, a(0), a(1), BinaryOp::Div)?,
        Op::Maximum => binary(op, a(0), a(1), BinaryOp::Maximum)?,
        Op::Minimum => binary(op, a(0), a(1), BinaryOp::Minimum)?,
        Op::Compare { cmp } => {
            let k = match cmp {
                Cmp::Gt => BinaryOp::Gt,
                Cmp::Ge => BinaryOp::Ge,
                Cmp::Lt => BinaryOp::Lt,
                Cmp::Le => BinaryOp::Le,
                Cmp::Eq => BinaryOp::Eq,
                Cmp::Ne => BinaryOp::Ne,
            };
            binary(op, a(0), a(1), k)?
        }
        Op::Select => {
            let [out] = crate::fused::fused([a(0), a(1), a(2)], out_shape, [None], |[c, x, y]| {
                [cpu::scalar::select(c, x, y)]
            })?;
            out
        }
        Op::ReluGrad => binary(op, a(0), a(1), BinaryOp::ReluGrad)?,
        Op::GeluGrad => binary(op, a(0), a(1), BinaryOp::GeluGrad)?,
        Op::GeluTanhGrad => binary(op, a(0), a(1), BinaryOp::GeluTanhGrad)?,
        Op::Sum { axes, keepdim } => reduce(op, a(0), ReduceOp::Sum, axes, *keepdim)?,
        Op::Mean { axes, keepdim } => reduce(op, a(0), ReduceOp::Mean, axes, *keepdim)?,
        Op::Max { axes, keepdim } => reduce(op, a(0), ReduceOp::Max, axes, *keepdim)?,
        Op::MatMul => {
            let ((da, la), (db, lb)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            let (out, shape) = cpu::matmul(da, la, db, lb)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::TopK { k } => {
            let (x, l) = f32s(a(0), op)?;
            Tensor::from_kernel(cpu::top_k(x, l, *k)?.0, out_shape)
        }
        Op::TopKIndices { k } => {
            let (x, l) = f32s(a(0), op)?;
            Tensor::from_i64(cpu::top_k(x, l, *k)?.1, out_shape)?
        }
        Op::TopKGrad { k } => {
            let ((x, lx), (g, lg)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            Tensor::from_kernel(cpu::top_k_grad(x, lx, g, lg, *k)?, out_shape)
        }
        Op::Attention { causal } => {
            let (q, k, v) = (f32s(a(0), op)?, f32s(a(1), op)?, f32s(a(2), op)?);
            let (out, shape) = cpu::attention(q, k, v, *causal)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::AttentionGrad { causal } => {
            let (q, k, v) = (f32s(a(0), op)?, f32s(a(1), op)?, f32s(a(2), op)?);
            let (out, shape) = cpu::attention_grad(q, k, v, f32s(a(3), op)?, *causal)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::Conv2d { stride, padding } => {
            let ((dx, lx), (dw, lw)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            let (out, shape) = cpu::conv2d(dx, lx, dw, lw, *stride, *padding)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::Conv2dGradInput { stride, padding } => {
            let ((dg, lg), (dw, lw)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            Tensor::from_kernel(
                cpu::conv2d_grad_input(dg, lg, dw, lw, a(2).shape(), *stride, *padding)?,
                out_shape,
            )
        }
        Op::Conv2dGradWeight { stride, padding } => {
            let ((dx, lx), (dg, lg)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            Tensor::from_kernel(
                cpu::conv2d_grad_weight(dx, lx, dg, lg, a(2).shape(), *stride, *padding)?,
                out_shape,
            )
        }
        Op::MaxPool2d {
            kernel,
            stride,
            padding,
        } => {
            let (d, l) = f32s(a(0), op)?;
            let (out, shape) = cpu::max_pool2d(d, l, *kernel, *stride, *padding)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::MaxPool2dGrad {
            kernel,
            stride,
            padding,
        } => {
            let ((dx, lx), (dg, lg)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            Tensor::from_kernel(
                cpu::max_pool2d_grad(dx, lx, dg, lg, *kernel, *stride, *padding)?,
                out_shape,
            )
        }
        Op::AvgPool2d {
            kernel,
            stride,
            padding,
        } => {
            let (d, l) = f32s(a(0), op)?;
            let (out, shape) = cpu::avg_pool2d(d, l, *kernel, *stride, *padding)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::AvgPool2dGrad {
            kernel,
            stride,
            padding,
        } => {
            let (dg, lg) = f32s(a(1), op)?;
            Tensor::from_kernel(
                cpu::avg_pool2d_grad(dg, lg, a(0).shape(), *kernel, *stride, *padding)?,
                out_shape,
            )
        }
        Op::Embedding => {
            let (dt, lt) = f32s(a(0), op)?;
            let ids = a(1).i64_contiguous("embedding ids")?;
            Tensor::from_kernel(cpu::gather_rows(dt, lt, &ids)?, out_shape)
        }
        Op::Pick => {
            let (d, l) = f32s(a(0), op)?;
            let ids = a(1).i64_contiguous("pick indices")?;
            Tensor::from_kernel(cpu::pick_last(d, l, &ids)?, out_shape)
        }
        Op::PickGrad => {
            let (dg, lg) = f32s(a(0), op)?;
            let ids = a(1).i64_contiguous("pick indices")?;
            Tensor::from_kernel(cpu::pick_last_grad(dg, lg, &ids, a(2).shape())?, out_shape)
        }
        Op::EmbeddingGrad => {
            let (dg, lg) = f32s(a(0), op)?;
            let vocab = a(2).shape()[0];
            let ids = a(1).i64_contiguous("embedding ids")?;
            Tensor::from_kernel(cpu::scatter_add_rows(dg, lg, &ids, vocab)?, out_shape)
        }
        Op::Positions { .. } => {
            // The shape rule ran: the output is [n].
            positions(out_shape.first().copied().unwrap_or(0))?
        }
        Op::ArgMax { axis } => {
            let (d, l) = f32s(a(0), op)?;
            Tensor::from_i64(cpu::argmax(d, l, *axis)?, out_shape)?
        }
        Op::Iota { axis } => {
            // The output shape is 1 but on `axis` (the shape rule ran): its values count up.
            let n = out_shape.get(*axis).copied().unwrap_or(1);
            let mut data = rtx_backends::pool::take(n);
            for (i, v) in data.iter_mut().enumerate() {
                *v = i as f32;
            }
            Tensor::from_kernel(data, out_shape)
        }
        Op::DropoutMask { p } => {
            if ctx.train && *p > 0.0 {
                let seed = ctx.next_seed();
                Tensor::from_kernel(cpu::dropout_mask(a(0).numel(), *p as f32, seed)?, out_shape)
            } else {
                Tensor::full(out_shape, 1.0)
            }
        }
        Op::Reshape { .. } => a(0).reshape(out_shape)?,
        Op::Permute { perm } => a(0).with_layout(a(0).layout().permute(perm)),
        Op::Narrow { axis, start, len } => {
            a(0).with_layout(a(0).layout().narrow(*axis, *start, *len))
        }
        Op::BroadcastTo => a(0).with_layout(a(0).layout().broadcast_to(out_shape)),
        Op::Concat { axis } => {
            let parts: Vec<(&[f32], &Layout)> =
                args.iter().map(|t| f32s(t, op)).collect::<Result<_>>()?;
            let (out, shape) = cpu::concat(&parts, *axis)?;
            Tensor::from_kernel(out, &shape)
        }
        Op::PadNarrow { axis, start } => {
            let (dg, lg) = f32s(a(0), op)?;
            Tensor::from_kernel(
                cpu::pad_narrow(dg, lg, *axis, *start, a(1).shape()[*axis])?,
                out_shape,
            )
        }
        Op::ConcatGrad { axis, index } => {
            // The shape rule checked `g` against the parts, so the slice is in range.
            let start: usize = args[1..1 + index].iter().map(|t| t.shape()[*axis]).sum();
            let len = args[1 + index].shape()[*axis];
            a(0).with_layout(a(0).layout().narrow(*axis, start, len))
        }
        Op::SumTo => {
            let (dg, lg) = f32s(a(0), op)?;
            Tensor::from_kernel(cpu::sum_to(dg, lg, out_shape)?, out_shape)
        }
        Op::MeanGrad { axes, keepdim } => {
            let (dg, lg) = f32s(a(1), op)?;
            let count: usize = axes.iter().map(|&i| out_shape[i]).product();
            let l = unreduce_layout(lg, out_shape, axes, *keepdim);
            Tensor::from_kernel(
                cpu::unary(UnaryOp::MulScalar(1.0 / count.max(1) as f32), dg, &l)?,
                out_shape,
            )
        }
        Op::MaxGrad { axes, keepdim } => {
            let ((dx, lx), (dg, lg)) = (f32s(a(0), op)?, f32s(a(1), op)?);
            Tensor::from_kernel(cpu::max_grad(dx, lx, dg, lg, axes, *keepdim)?, out_shape)
        }
    })
}

/// A gradient as a contiguous tensor of the parameter's shape (backward values may be
/// broadcast views).
pub fn materialize(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() != shape {
        return Err(RtxError::ShapeMismatch {
            context: "gradient".into(),
            expected: crate::tensor::fmt_dims(shape),
            found: crate::tensor::fmt_dims(g.shape()),
        });
    }
    g.try_contiguous()
}

/// The positions `0..n` as an i64 tensor `[n]`. The few lengths a program uses are kept
/// (a tensor's data is never written in place once shared), so a step that reads them
/// allocates nothing.
fn positions(n: usize) -> Result<Tensor> {
    use std::sync::Mutex;
    const KEPT: usize = 8;
    static MADE: Mutex<Vec<Tensor>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().ok();
    if let Some(t) = made
        .as_ref()
        .and_then(|m| m.iter().find(|t| t.shape() == [n]))
    {
        return Ok(t.clone());
    }
    let t = Tensor::from_i64((0..n as i64).collect(), &[n])?;
    if let Some(m) = made.as_mut().filter(|m| m.len() < KEPT) {
        m.push(t.clone());
    }
    Ok(t)
}
