//! The nn ops on a GPU: attention, convolution, pooling and top-k, each the
//! backend's kernel over contiguous operands.

use super::ops::{contiguous, fresh, gpu};
use crate::device::GpuStorage;
use crate::error::{Result, RtxError};
use crate::tensor::{DType, Storage, Tensor};
use rtx_backends::Layout;
use rtx_backends::gpu::{DeviceBuffer, Gpu};
use rtx_backends::kernel_meta::{
    ATTENTION_MAX_HEAD, AttentionShape, ConvPass, ConvShape, PoolPass,
};
use rtx_ir::Op;
use std::sync::Arc;

/// `op` over `args` when it is one of this file's ops (and the device kernel takes these
/// operands), else `None`.
pub(crate) fn run(op: &Op, args: &[&Tensor], out_shape: &[usize]) -> Result<Option<Tensor>> {
    let a = |i: usize| -> Result<&Tensor> {
        args.get(i)
            .copied()
            .ok_or_else(|| RtxError::Gpu(format!("`{op:?}` is missing operand {i}")))
    };
    Ok(Some(match op {
        Op::Attention { causal } | Op::AttentionGrad { causal }
            if attention_fits(a(0)?, a(1)?, a(2)?, matches!(op, Op::AttentionGrad { .. })) =>
        {
            let (q, k, v) = (contiguous(a(0)?)?, contiguous(a(1)?)?, contiguous(a(2)?)?);
            let r = q.rank();
            let shape = AttentionShape {
                slices: q.shape()[..r - 2].iter().product(),
                queries: q.shape()[r - 2],
                keys: k.shape()[r - 2],
                head: q.shape()[r - 1],
                value_head: v.shape()[r - 1],
                causal: *causal,
            };
            let device = Arc::clone(&gpu(&q)?.device);
            let out = fresh(&device, out_shape)?;
            let (bq, bk, bv) = (&gpu(&q)?.buffer, &gpu(&k)?.buffer, &gpu(&v)?.buffer);
            if matches!(op, Op::Attention { .. }) {
                device.attention(shape, [bq, bk, bv], &gpu(&out)?.buffer)?;
            } else {
                let g = contiguous(a(3)?)?;
                device.attention_grad(shape, [bq, bk, bv, &gpu(&g)?.buffer], &gpu(&out)?.buffer)?;
            }
            out
        }
        Op::TopK { k } | Op::TopKIndices { k } | Op::TopKGrad { k } => {
            let x = contiguous(a(0)?)?;
            let n = x.shape().last().copied().unwrap_or(1);
            let rows = x.numel() / n.max(1);
            let device = Arc::clone(&gpu(&x)?.device);
            if let Op::TopKGrad { .. } = op {
                let g = contiguous(a(1)?)?;
                let out = fresh(&device, out_shape)?;
                device.top_k_grad(
                    &gpu(&x)?.buffer,
                    &gpu(&g)?.buffer,
                    (rows, n, *k),
                    &gpu(&out)?.buffer,
                )?;
                out
            } else {
                let values = fresh(&device, out_shape)?;
                let positions = device.zeros(rows * k)?;
                device.top_k(
                    &gpu(&x)?.buffer,
                    (rows, n, *k),
                    &gpu(&values)?.buffer,
                    &positions,
                )?;
                if let Op::TopK { .. } = op {
                    values
                } else {
                    indices(device, positions, out_shape)
                }
            }
        }
        Op::Conv2d { stride, padding }
        | Op::Conv2dGradInput { stride, padding }
        | Op::Conv2dGradWeight { stride, padding } => {
            let (a0, a1) = (contiguous(a(0)?)?, contiguous(a(1)?)?);
            let dims = |t: &[usize]| -> Result<[usize; 4]> {
                t.try_into()
                    .map_err(|_| RtxError::Gpu(format!("conv2d operand of shape {t:?}")))
            };
            let (pass, x, w, y) = match op {
                Op::Conv2d { .. } => (ConvPass::Forward, a0.shape(), a1.shape(), out_shape),
                Op::Conv2dGradInput { .. } => {
                    (ConvPass::GradInput, out_shape, a1.shape(), a0.shape())
                }
                _ => (ConvPass::GradWeight, a0.shape(), out_shape, a1.shape()),
            };
            let shape = ConvShape {
                x: dims(x)?,
                w: dims(w)?,
                y: dims(y)?,
                stride: *stride,
                padding: *padding,
            };
            let device = Arc::clone(&gpu(&a0)?.device);
            let out = fresh(&device, out_shape)?;
            device.conv2d(
                pass,
                shape,
                [&gpu(&a0)?.buffer, &gpu(&a1)?.buffer],
                &gpu(&out)?.buffer,
            )?;
            out
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
        }
        | Op::MaxPool2dGrad {
            kernel,
            stride,
            padding,
        }
        | Op::AvgPool2dGrad {
            kernel,
            stride,
            padding,
        } => {
            // Operands: x for the forward passes, (x, g) for the max gradient, (x_like, g)
            // for the average gradient.
            let (pass, x_shape, out_hw) = match op {
                Op::MaxPool2d { .. } => (PoolPass::Max, a(0)?.shape(), &out_shape[2..]),
                Op::AvgPool2d { .. } => (PoolPass::Avg, a(0)?.shape(), &out_shape[2..]),
                Op::MaxPool2dGrad { .. } => (PoolPass::MaxGrad, a(0)?.shape(), &a(1)?.shape()[2..]),
                _ => (PoolPass::AvgGrad, out_shape, &a(1)?.shape()[2..]),
            };
            let x_shape: [usize; 4] = x_shape
                .try_into()
                .map_err(|_| RtxError::Gpu(format!("pooling of shape {x_shape:?}")))?;
            let out_hw: [usize; 2] = out_hw
                .try_into()
                .map_err(|_| RtxError::Gpu(format!("pooling to {out_hw:?}")))?;
            let first = contiguous(a(usize::from(pass == PoolPass::AvgGrad))?)?;
            let second = match pass {
                PoolPass::MaxGrad => contiguous(a(1)?)?,
                _ => first.clone(),
            };
            let device = Arc::clone(&gpu(&first)?.device);
            let out = fresh(&device, out_shape)?;
            device.pool2d(
                (pass, x_shape, out_hw),
                (*kernel, *stride, *padding),
                [&gpu(&first)?.buffer, &gpu(&second)?.buffer],
                &gpu(&out)?.buffer,
            )?;
            out
        }
        _ => return Ok(None),
    }))
}

/// Indices a kernel wrote as u32 words, as an i64 tensor on the device.
pub(crate) fn indices(device: Arc<Gpu>, words: DeviceBuffer, shape: &[usize]) -> Tensor {
    Tensor::from_parts(
        Storage::Gpu(GpuStorage {
            device,
            buffer: words,
            dtype: DType::I64,
            host_i64: None,
        }),
        Layout::contiguous(shape),
    )
}

/// Whether the device attention kernels take these operands: heads up to
/// `ATTENTION_MAX_HEAD`, equal batch axes, and for the gradient q, k and v of one shape (a
/// causal mask's Tq == Tk the shape rule checked). Others run on the CPU.
fn attention_fits(q: &Tensor, k: &Tensor, v: &Tensor, gradient: bool) -> bool {
    let r = q.rank();
    r >= 2
        && k.rank() == r
        && v.rank() == r
        && k.shape()[..r - 1] == v.shape()[..r - 1]
        && q.shape()[r - 1] <= ATTENTION_MAX_HEAD
        && v.shape()[r - 1] <= ATTENTION_MAX_HEAD
        && (!gradient || (q.shape() == k.shape() && v.shape() == k.shape()))
        && q.shape()[..r - 2] == k.shape()[..r - 2]
}
