//! Matmuls on a GPU: the backend's GEMM for a bare product (wgpu's tiled kernel, cuBLAS on
//! CUDA), and for a `MatMulEpilogue` on wgpu the GEMM with the epilogue group in its store
//! (`rtx_ir::emit::gemm_epilogue`), on CUDA cuBLAS then the group as one kernel over the
//! product (`KernelKind::Epilogue`).

use super::ops::{as_kernel, broadcast_strides, copy_to, fresh, gpu, pointwise, u32_of, view};
use crate::ctx::Ctx;
use crate::error::Result;
use crate::tensor::Tensor;
use rtx_backends::gpu::DeviceView;
use rtx_ir::NodeId;
use rtx_ir::emit::{KernelKind, KernelSource, Meta};
use rtx_ir::fusion::Instr;
use std::sync::Arc;

/// The operands of `a @ b` as `[batches, m, k]` and `[batches, k, n]` views: batch axes
/// flattened to one stride when they nest like a contiguous block (0 for a 2-D operand),
/// otherwise the operand copied out in full first. The tensors returned own the views.
struct Gemm {
    a: Tensor,
    a_batch: usize,
    b: Tensor,
    b_batch: usize,
    batches: usize,
    m: usize,
    k: usize,
    n: usize,
}

impl Gemm {
    fn new(a: &Tensor, b: &Tensor, out_shape: &[usize]) -> Result<Gemm> {
        let r = out_shape.len();
        let batch_shape = &out_shape[..r - 2];
        let batches: usize = batch_shape.iter().product();
        let operand = |t: &Tensor| -> Result<(Tensor, usize)> {
            let l = t.layout();
            let tr = l.rank();
            if tr == 2 {
                return Ok((t.clone(), 0));
            }
            let own = &l.shape[..tr - 2];
            if own == batch_shape {
                let nests = (0..own.len().saturating_sub(1))
                    .all(|i| own[i + 1] == 1 || l.strides[i] == l.strides[i + 1] * own[i + 1]);
                if nests {
                    let stride = if batches == 1 { 0 } else { l.strides[tr - 3] };
                    return Ok((t.clone(), stride));
                }
            }
            let mut full = batch_shape.to_vec();
            full.extend_from_slice(&l.shape[tr - 2..]);
            let c = copy_to(t, &full)?;
            Ok((c, l.shape[tr - 2] * l.shape[tr - 1]))
        };
        let (a, a_batch) = operand(a)?;
        let (b, b_batch) = operand(b)?;
        let (la, lb) = (a.layout(), b.layout());
        let (m, k) = (la.shape[la.rank() - 2], la.shape[la.rank() - 1]);
        let n = lb.shape[lb.rank() - 1];
        Ok(Gemm {
            a,
            a_batch,
            b,
            b_batch,
            batches,
            m,
            k,
            n,
        })
    }

    fn views(&self) -> Result<(DeviceView<'_>, DeviceView<'_>)> {
        let (la, lb) = (self.a.layout(), self.b.layout());
        let a = DeviceView {
            shape: vec![self.batches, self.m, self.k],
            strides: vec![
                self.a_batch,
                la.strides[la.rank() - 2],
                la.strides[la.rank() - 1],
            ],
            ..view(&self.a)?
        };
        let b = DeviceView {
            shape: vec![self.batches, self.k, self.n],
            strides: vec![
                self.b_batch,
                lb.strides[lb.rank() - 2],
                lb.strides[lb.rank() - 1],
            ],
            ..view(&self.b)?
        };
        Ok((a, b))
    }
}

/// `a @ b` with batch axes broadcast to `out_shape`'s.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, out_shape: &[usize]) -> Result<Tensor> {
    let device = Arc::clone(&gpu(a)?.device);
    let gemm = Gemm::new(a, b, out_shape)?;
    let (va, vb) = gemm.views()?;
    let out = fresh(&device, out_shape)?;
    device.matmul(&va, &vb, &gpu(&out)?.buffer)?;
    Ok(out)
}

/// A matmul step's group: its body, the node ids of its outputs, and its kernel.
pub(crate) struct Epilogue<'a> {
    pub body: &'a [Instr],
    pub outputs: &'a [NodeId],
    pub kernel: &'a KernelSource,
}

/// A matmul `a @ b` (of shape `product_shape`) and its epilogue group of `shape`: `others`
/// are the group's inputs after the product; returns one contiguous tensor per output.
pub(crate) fn gemm_epilogue(
    (a, b, product_shape): (&Tensor, &Tensor, &[usize]),
    others: &[&Tensor],
    group: Epilogue,
    shape: &[usize],
    ctx: &Ctx,
) -> Result<Vec<Tensor>> {
    if group.kernel.kind == KernelKind::Epilogue {
        // The vendor GEMM writes the product; the group then reads it as its input 0, in
        // the group's shape (a Linear on `[B, T, C]` multiplies `[B * T, C]` rows and its
        // group runs over `[B, T, OUT]`: the same values, contiguous either way).
        let product = matmul(a, b, product_shape)?;
        let product = if product.shape() == shape {
            product
        } else {
            product.reshape(shape)?
        };
        let mut inputs = vec![&product];
        inputs.extend_from_slice(others);
        return pointwise(
            group.body,
            &inputs,
            group.outputs,
            shape,
            Some(group.kernel),
            ctx,
        );
    }
    let device = Arc::clone(&gpu(a)?.device);
    let gemm = Gemm::new(a, b, product_shape)?;
    let (va, vb) = gemm.views()?;
    // The group's meta with the product as input 0 (its words are never read), then the
    // GEMM's sizes and operand layouts.
    let dims: Vec<u32> = shape
        .iter()
        .map(|&d| u32_of(d, "dimension"))
        .collect::<Result<_>>()?;
    let mut per_input = vec![(0u32, vec![0u32; shape.len()])];
    for t in others {
        per_input.push((
            u32_of(t.layout().offset, "offset")?,
            broadcast_strides(t, shape)?,
        ));
    }
    let mut words = Meta::words(&dims, &per_input, ctx.rounding().words());
    for v in [
        gemm.m,
        gemm.k,
        gemm.n,
        gemm.batches,
        va.offset,
        va.strides[0],
        va.strides[1],
        va.strides[2],
        vb.offset,
        vb.strides[0],
        vb.strides[1],
        vb.strides[2],
    ] {
        words.push(u32_of(v, "matmul size")?);
    }
    let outs: Vec<Tensor> = (0..group.outputs.len())
        .map(|_| fresh(&device, shape))
        .collect::<Result<_>>()?;
    if gemm.batches * gemm.m * gemm.n == 0 {
        return Ok(outs);
    }
    let meta = device.upload_u32(&words)?;
    let mut buffers = vec![&meta, va.buffer, vb.buffer];
    for t in others {
        buffers.push(&gpu(t)?.buffer);
    }
    for t in &outs {
        buffers.push(&gpu(t)?.buffer);
    }
    let tile = rtx_ir::emit::GEMM_TILE as usize;
    let groups = [
        u32_of(gemm.n.div_ceil(tile), "matmul grid")?,
        u32_of(gemm.m.div_ceil(tile), "matmul grid")?,
        u32_of(gemm.batches, "matmul batch count")?,
    ];
    device.dispatch_wgsl(&as_kernel(group.kernel), &buffers, groups)?;
    Ok(outs)
}
