//! One GPU behind one API, whichever backend drives it: rtx-core's device executor
//! (`rtx_core::gpu`) calls these methods, and each runs the backend's own kernel for the op:
//! wgpu's WGSL kernels (`crate::wgpu`), or CUDA's kernels and cuBLAS (`crate::cuda`).
//!
//! The two backends were written to meet here: both hold values as 32-bit words in buffers
//! taken by shared reference, read the same meta words (`kernel_meta`), run the kernels
//! `rtx_ir::emit` writes for their target with the same buffer order (meta, inputs,
//! outputs), and take the same strided views. So this file is a table of matches, one arm
//! per backend, and a new backend is a new arm in each.
//!
//! A buffer of one backend handed to a device of the other is a `GpuError::Call`, never a
//! panic (rtx-core checks devices before any kernel, so it is an internal error).

#[cfg(feature = "cuda")]
use crate::cuda::{CudaBuffer, CudaDevice, CudaKernel, CudaView};
use crate::gpu_error::{GpuError, Result};
use crate::kernel_meta::{AttentionShape, ConvPass, ConvShape, PoolPass, Reduce, UpdateRule};
#[cfg(feature = "wgpu")]
use crate::wgpu::{GpuBuffer, GpuView, Kernel as WgslKernel, WgpuDevice};

/// A GPU: a wgpu adapter (Vulkan, Metal, DX12, llvmpipe) or a CUDA device.
// One per device, behind an `Arc`: the variants' sizes never multiply.
#[allow(clippy::large_enum_variant)]
pub enum Gpu {
    #[cfg(feature = "wgpu")]
    Wgpu(WgpuDevice),
    #[cfg(feature = "cuda")]
    Cuda(CudaDevice),
}

/// A buffer of 32-bit words on a [`Gpu`]; freed into its device's pool on drop.
pub enum DeviceBuffer {
    #[cfg(feature = "wgpu")]
    Wgpu(GpuBuffer),
    #[cfg(feature = "cuda")]
    Cuda(CudaBuffer),
}

/// A strided view of a buffer's f32 values: element offset, then sizes and strides.
pub struct DeviceView<'a> {
    pub buffer: &'a DeviceBuffer,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

/// A kernel to run: its source for the device's target (WGSL or CUDA C), entry point and a
/// name for errors, as `rtx_ir::emit::KernelSource` gives them.
#[derive(Clone, Copy, Debug)]
pub struct Kernel<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub entry: &'a str,
}

/// The kernel language a [`Gpu`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelLanguage {
    Wgsl,
    Cuda,
}

fn foreign(what: &str) -> GpuError {
    GpuError::Call(format!("{what}: a buffer of another device"))
}

impl DeviceBuffer {
    pub fn len(&self) -> usize {
        match self {
            #[cfg(feature = "wgpu")]
            DeviceBuffer::Wgpu(b) => b.len(),
            #[cfg(feature = "cuda")]
            DeviceBuffer::Cuda(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(feature = "wgpu")]
    fn wgpu(&self) -> Result<&GpuBuffer> {
        #[allow(unreachable_patterns)]
        match self {
            DeviceBuffer::Wgpu(b) => Ok(b),
            _ => Err(foreign("a wgpu kernel")),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self) -> Result<&CudaBuffer> {
        #[allow(unreachable_patterns)]
        match self {
            DeviceBuffer::Cuda(b) => Ok(b),
            _ => Err(foreign("a CUDA kernel")),
        }
    }
}

impl DeviceView<'_> {
    #[cfg(feature = "wgpu")]
    fn wgpu(&self) -> Result<GpuView<'_>> {
        Ok(GpuView {
            buffer: self.buffer.wgpu()?,
            offset: self.offset,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self) -> Result<CudaView<'_>> {
        Ok(CudaView {
            buffer: self.buffer.cuda()?,
            offset: self.offset,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        })
    }
}

impl Kernel<'_> {
    #[cfg(feature = "wgpu")]
    fn wgsl(&self) -> WgslKernel<'_> {
        WgslKernel {
            name: self.name,
            source: self.source,
            entry: self.entry,
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self) -> CudaKernel<'_> {
        CudaKernel {
            name: self.name,
            source: self.source,
            entry: self.entry,
        }
    }
}

/// Runs `$wgpu` with `$d` bound to the wgpu device, or `$cuda` with it bound to the CUDA
/// device; each arm evaluates to a `Result` of the backend.
macro_rules! on {
    ($gpu:expr, $d:ident => wgpu: $wgpu:expr, cuda: $cuda:expr) => {
        match $gpu {
            #[cfg(feature = "wgpu")]
            Gpu::Wgpu($d) => $wgpu,
            #[cfg(feature = "cuda")]
            Gpu::Cuda($d) => $cuda,
        }
    };
}

impl Gpu {
    /// The kernel language of this device's backend, which `rtx_ir::emit` writes for it.
    pub fn language(&self) -> KernelLanguage {
        on!(self, _d => wgpu: KernelLanguage::Wgsl, cuda: KernelLanguage::Cuda)
    }

    /// The backend and the adapter or card, e.g. `wgpu:llvmpipe (LLVM 15.0.6, 256 bits)` or
    /// `cuda:0 NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        on!(self, d => wgpu: format!("wgpu:{}", d.describe()),
            cuda: format!("cuda:{} {}", d.ordinal(), d.describe()))
    }

    /// Sends recorded work to the device without waiting for it (wgpu batches dispatches;
    /// CUDA launches as it goes).
    pub fn submit(&self) -> Result<()> {
        on!(self, d => wgpu: d.submit(), cuda: { let _ = d; Ok(()) })
    }

    /// Waits for everything queued on the device.
    pub fn finish(&self) -> Result<()> {
        on!(self, d => wgpu: d.finish(), cuda: d.synchronize())
    }

    pub fn upload_f32(&self, data: &[f32]) -> Result<DeviceBuffer> {
        on!(self, d => wgpu: d.upload_f32(data).map(DeviceBuffer::Wgpu),
            cuda: d.upload_f32(data).map(DeviceBuffer::Cuda))
    }

    pub fn upload_u32(&self, data: &[u32]) -> Result<DeviceBuffer> {
        on!(self, d => wgpu: d.upload_u32(data).map(DeviceBuffer::Wgpu),
            cuda: d.upload_u32(data).map(DeviceBuffer::Cuda))
    }

    /// A buffer of `len` zero words.
    pub fn zeros(&self, len: usize) -> Result<DeviceBuffer> {
        on!(self, d => wgpu: d.zeros(len).map(DeviceBuffer::Wgpu),
            cuda: d.zeros(len).map(DeviceBuffer::Cuda))
    }

    /// The words of `buf` as f32, copied back once queued work is done.
    pub fn read_f32(&self, buf: &DeviceBuffer) -> Result<Vec<f32>> {
        on!(self, d => wgpu: d.read_f32(buf.wgpu()?), cuda: d.read_f32(buf.cuda()?))
    }

    /// Runs an emitted pointwise or row kernel (buffers: meta, inputs, outputs) over `n`
    /// threads, `group` per workgroup or block.
    pub fn run_emitted(
        &self,
        kernel: &Kernel,
        meta: &[u32],
        inputs: &[&DeviceBuffer],
        outputs: &[&DeviceBuffer],
        n: usize,
        group: u32,
    ) -> Result<()> {
        on!(self, d => wgpu: {
            let ins = inputs.iter().map(|b| b.wgpu()).collect::<Result<Vec<_>>>()?;
            let outs = outputs.iter().map(|b| b.wgpu()).collect::<Result<Vec<_>>>()?;
            d.run_pointwise(&kernel.wgsl(), meta, &ins, &outs, n, group)
        }, cuda: {
            let ins = inputs.iter().map(|b| b.cuda()).collect::<Result<Vec<_>>>()?;
            let outs = outputs.iter().map(|b| b.cuda()).collect::<Result<Vec<_>>>()?;
            d.run_emitted(&kernel.cuda(), meta, &ins, &outs, n, group)
        })
    }

    /// Dispatches a WGSL kernel over `groups` workgroups with `buffers` bound in order (the
    /// GEMM with an epilogue in its store); CUDA runs cuBLAS and the epilogue instead.
    pub fn dispatch_wgsl(
        &self,
        kernel: &Kernel,
        buffers: &[&DeviceBuffer],
        groups: [u32; 3],
    ) -> Result<()> {
        on!(self, d => wgpu: {
            let bufs = buffers.iter().map(|b| b.wgpu()).collect::<Result<Vec<_>>>()?;
            d.dispatch(&kernel.wgsl(), &bufs, groups)
        }, cuda: {
            let _ = (d, buffers, groups);
            Err(GpuError::Call(format!("`{}`: WGSL on a CUDA device", kernel.name)))
        })
    }

    /// `out = a @ b` for `[batches, m, k]` and `[batches, k, n]` views (a batch stride of 0
    /// broadcasts), written contiguously.
    pub fn matmul(&self, a: &DeviceView, b: &DeviceView, out: &DeviceBuffer) -> Result<()> {
        on!(self, d => wgpu: d.matmul(&a.wgpu()?, &b.wgpu()?, out.wgpu()?),
            cuda: d.matmul(&a.cuda()?, &b.cuda()?, out.cuda()?))
    }

    /// Reduces `x` over the axes marked in `reduced` into the contiguous `out`.
    pub fn reduce(
        &self,
        x: &DeviceView,
        reduced: &[bool],
        mode: Reduce,
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.reduce(&x.wgpu()?, reduced, mode, out.wgpu()?),
            cuda: d.reduce(&x.cuda()?, reduced, mode, out.cuda()?))
    }

    /// `out[r] = x[r, idx[r]]` over contiguous `[rows, cols]` values.
    pub fn pick(
        &self,
        x: &DeviceBuffer,
        idx: &DeviceBuffer,
        (rows, cols): (usize, usize),
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.pick(x.wgpu()?, idx.wgpu()?, rows, cols, out.wgpu()?),
            cuda: d.pick(x.cuda()?, idx.cuda()?, rows, cols, out.cuda()?))
    }

    /// `out[r, j] = g[r]` where `j == idx[r]`, else 0.
    pub fn pick_grad(
        &self,
        g: &DeviceBuffer,
        idx: &DeviceBuffer,
        (rows, cols): (usize, usize),
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.pick_grad(g.wgpu()?, idx.wgpu()?, rows, cols, out.wgpu()?),
            cuda: d.pick_grad(g.cuda()?, idx.cuda()?, rows, cols, out.cuda()?))
    }

    /// `out[r, :] = w[ids[r], :]` for `rows` ids (checked by the caller).
    pub fn gather_rows(
        &self,
        w: &DeviceView,
        ids: &DeviceBuffer,
        rows: usize,
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.gather_rows(&w.wgpu()?, ids.wgpu()?, rows, out.wgpu()?),
            cuda: d.gather_rows(&w.cuda()?, ids.cuda()?, rows, out.cuda()?))
    }

    /// The embedding gradient: `out[v, :]` sums `g`'s rows `rows[starts[v]..starts[v + 1]]`.
    pub fn scatter_rows(
        &self,
        g: &DeviceBuffer,
        (starts, rows): (&DeviceBuffer, &DeviceBuffer),
        (vocab, cols): (usize, usize),
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.scatter_rows(
                g.wgpu()?, starts.wgpu()?, rows.wgpu()?, vocab, cols, out.wgpu()?),
            cuda: d.scatter_rows(
                g.cuda()?, starts.cuda()?, rows.cuda()?, vocab, cols, out.cuda()?))
    }

    /// Copies the strided view `x` into the strided view `out` (the same shape).
    pub fn copy_into(&self, x: &DeviceView, out: &DeviceView) -> Result<()> {
        on!(self, d => wgpu: d.copy_into(&x.wgpu()?, &out.wgpu()?), cuda: {
            if x.shape != out.shape {
                return Err(GpuError::Call(format!(
                    "copy of {:?} into {:?}", x.shape, out.shape
                )));
            }
            d.copy_into(&x.cuda()?, out.buffer.cuda()?, out.offset, &out.strides)
        })
    }

    /// The gradient of a max over the axes marked in `reduced` of a contiguous `shape`,
    /// from each output's first maximum (`firsts`, u32 positions).
    pub fn scatter_first(
        &self,
        (shape, reduced): (&[usize], &[bool]),
        g: &DeviceBuffer,
        firsts: &DeviceBuffer,
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.scatter_first(shape, reduced, g.wgpu()?, firsts.wgpu()?, out.wgpu()?),
            cuda: d.scatter_first(shape, reduced, g.cuda()?, firsts.cuda()?, out.cuda()?))
    }

    /// `softmax(q k^T / sqrt(D)) v` over contiguous operands.
    pub fn attention(
        &self,
        shape: AttentionShape,
        [q, k, v]: [&DeviceBuffer; 3],
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.attention(shape, q.wgpu()?, k.wgpu()?, v.wgpu()?, out.wgpu()?),
            cuda: d.attention(shape, [q.cuda()?, k.cuda()?, v.cuda()?], out.cuda()?))
    }

    /// The gradients of [`Gpu::attention`] for q, k and v, stacked in `out [3, ..]`.
    pub fn attention_grad(
        &self,
        shape: AttentionShape,
        [q, k, v, g]: [&DeviceBuffer; 4],
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.attention_grad(
                shape, [q.wgpu()?, k.wgpu()?, v.wgpu()?, g.wgpu()?], out.wgpu()?),
            cuda: d.attention_grad(
                shape, [q.cuda()?, k.cuda()?, v.cuda()?, g.cuda()?], out.cuda()?))
    }

    /// One pass of a convolution over contiguous operands (see [`ConvPass`]).
    pub fn conv2d(
        &self,
        pass: ConvPass,
        shape: ConvShape,
        [a, b]: [&DeviceBuffer; 2],
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.conv2d(pass, shape, a.wgpu()?, b.wgpu()?, out.wgpu()?),
            cuda: d.conv2d(pass, shape, a.cuda()?, b.cuda()?, out.cuda()?))
    }

    /// One pooling pass over contiguous operands (`b` is read by `MaxGrad` only).
    pub fn pool2d(
        &self,
        (pass, x_shape, out_hw): (PoolPass, [usize; 4], [usize; 2]),
        window: ([usize; 2], [usize; 2], [usize; 2]),
        [a, b]: [&DeviceBuffer; 2],
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.pool2d(pass, x_shape, window, out_hw, a.wgpu()?, b.wgpu()?, out.wgpu()?),
            cuda: d.pool2d(pass, x_shape, window, out_hw, a.cuda()?, b.cuda()?, out.cuda()?))
    }

    /// The `k` largest of each contiguous row of `n` (values and u32 positions, `[rows, k]`).
    pub fn top_k(
        &self,
        x: &DeviceBuffer,
        dims: (usize, usize, usize),
        values: &DeviceBuffer,
        positions: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.top_k(x.wgpu()?, dims, values.wgpu()?, positions.wgpu()?),
            cuda: d.top_k(x.cuda()?, dims, values.cuda()?, positions.cuda()?))
    }

    /// The gradient of [`Gpu::top_k`]: zeros with `g` at the positions top-k picks.
    pub fn top_k_grad(
        &self,
        x: &DeviceBuffer,
        g: &DeviceBuffer,
        dims: (usize, usize, usize),
        out: &DeviceBuffer,
    ) -> Result<()> {
        on!(self, d => wgpu: d.top_k_grad(x.wgpu()?, g.wgpu()?, dims, out.wgpu()?),
            cuda: d.top_k_grad(x.cuda()?, g.cuda()?, dims, out.cuda()?))
    }

    /// Updates `param` (`n` values) in place from `grad` and the state buffers.
    pub fn optimizer_step(
        &self,
        (rule, n): (UpdateRule, usize),
        param: &DeviceBuffer,
        grad: &DeviceBuffer,
        [first, second]: [&DeviceBuffer; 2],
    ) -> Result<()> {
        on!(self, d => wgpu: d.optimizer_step(
                rule, n, param.wgpu()?, grad.wgpu()?, first.wgpu()?, second.wgpu()?),
            cuda: d.optimizer_step(
                rule, n, param.cuda()?, grad.cuda()?, first.cuda()?, second.cuda()?))
    }
}
