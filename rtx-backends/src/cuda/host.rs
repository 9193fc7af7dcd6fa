//! The CPU standing in for a GPU under [`CudaDevice::on_cpu`](super::CudaDevice::on_cpu):
//! buffers in host memory, each kernel's CUDA C built by the host's `c++` under the shim of
//! `on_cpu.rs` and run thread by thread, and the CPU's GEMM for what cuBLAS computes.
//!
//! It exists so that everything above the driver calls (the kernels' meta words and buffer
//! order, the strided-view products' mapping to cuBLAS's leading dimensions and transposes,
//! rtx-core's executor on `Device::cuda`) runs in CI, on machines without a GPU. It is a
//! test device: slow, one launch at a time, and it refuses kernels that share memory between
//! threads (none of the runtime's do).

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use super::gemm::GemmShape;
use super::on_cpu::CudaOnCpu;
use super::runtime::{CudaBuffer, CudaKernel};
use super::{GpuError, Result};
use crate::Layout;

/// `len` words in host memory. They are read and written only while the owning [`Host`]'s
/// lock is held (uploads make them before anyone else sees them), the way a GPU's one
/// stream orders every use of a buffer.
pub(crate) struct HostWords {
    words: UnsafeCell<Box<[u32]>>,
    len: usize,
}

// SAFETY: every access after construction goes through `Host`, under its lock (see above).
unsafe impl Sync for HostWords {}

impl HostWords {
    pub(super) fn new(words: Vec<u32>) -> HostWords {
        let len = words.len();
        HostWords {
            words: UnsafeCell::new(words.into_boxed_slice()),
            len,
        }
    }

    /// `len` zeros, or `OutOfMemory` when the host cannot hold them (never an abort).
    pub(super) fn zeros(len: usize) -> Result<HostWords> {
        let requested = (len as u64).saturating_mul(4);
        let mut v: Vec<u32> = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| GpuError::OutOfMemory { requested })?;
        v.resize(len, 0);
        Ok(HostWords::new(v))
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn ptr(&self) -> *mut u32 {
        // SAFETY: only the pointer is taken; callers hold the device's lock to use it.
        unsafe { (&mut *self.words.get()).as_mut_ptr() }
    }
}

/// The CPU runner of a stand-in device: its kernel builder and the lock that orders work.
pub(crate) struct Host {
    kernels: CudaOnCpu,
    lock: Mutex<()>,
    /// Products by the tiled GEMM kernel (what a HIP device runs) instead of the CPU's GEMM.
    tiled_gemm: bool,
}

impl Host {
    pub(super) fn open(tiled_gemm: bool) -> Result<Host> {
        Ok(Host {
            kernels: CudaOnCpu::open()?,
            lock: Mutex::new(()),
            tiled_gemm,
        })
    }

    pub(super) fn describe(&self) -> String {
        let products = if self.tiled_gemm {
            ", products by the tiled GEMM kernel as on HIP"
        } else {
            ""
        };
        format!("CUDA kernels on {}{products}", self.kernels.describe())
    }

    pub(super) fn tiled_gemm(&self) -> bool {
        self.tiled_gemm
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // A panic while holding the lock left no buffer half-resized: keep going.
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn build(&self, kernel: &CudaKernel) -> Result<()> {
        self.kernels.build(kernel.name, kernel.source, kernel.entry)
    }

    pub(super) fn read(&self, words: &HostWords) -> Vec<u32> {
        let _order = self.lock();
        // SAFETY: the lock is held, so no kernel writes these words meanwhile.
        unsafe { (&*words.words.get()).to_vec() }
    }

    pub(super) fn copy(&self, src: &HostWords, dst: &HostWords) {
        let _order = self.lock();
        // SAFETY: the caller checked both hold `len` words; `ptr::copy` allows them to be
        // the same buffer; the lock is held.
        unsafe { std::ptr::copy(src.ptr(), dst.ptr(), src.len().min(dst.len())) }
    }

    /// Runs `kernel` over `grid` blocks of `group` threads with the meta words and then
    /// `buffers` as its parameters.
    pub(super) fn launch(
        &self,
        kernel: &CudaKernel,
        meta: &[u32],
        buffers: &[&HostWords],
        grid: [u32; 2],
        group: u32,
    ) -> Result<()> {
        let _order = self.lock();
        let buffers: Vec<*mut c_void> = buffers.iter().map(|b| b.ptr().cast::<c_void>()).collect();
        // SAFETY: the runtime's kernels take exactly these parameters (the meta words, then
        // the buffers' pointers) and touch only the elements their meta words describe,
        // which the caller sized the buffers for (as on a GPU); the lock is held for the
        // whole run.
        unsafe {
            self.kernels.launch(
                kernel.name,
                kernel.source,
                kernel.entry,
                meta,
                &buffers,
                [grid[0], grid[1], 1],
                [group, 1, 1],
            )
        }
    }

    /// What `cublasSgemm` computes for `shape` (checked by the caller to fit the buffers),
    /// by the CPU's GEMM over the same strided layouts.
    pub(super) fn gemm_f32(
        &self,
        shape: GemmShape,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &CudaBuffer,
    ) -> Result<()> {
        let GemmShape { m, n, k, .. } = shape;
        if m * n == 0 {
            return Ok(());
        }
        // A row-major operand steps its stored row stride along its rows; transposed, along
        // its columns.
        let [(_, _, a_ld), (_, _, b_ld)] = shape.stored();
        let steps = |transposed: bool, ld: usize| if transposed { [1, ld] } else { [ld, 1] };
        let [ar, ac] = steps(shape.a_transposed, a_ld);
        let [br, bc] = steps(shape.b_transposed, b_ld);
        let batch = |stride: usize| if shape.batches == 1 { 0 } else { stride };
        let la = Layout {
            shape: [shape.batches, m, k][..].into(),
            strides: [batch(shape.stride_a), ar, ac][..].into(),
            offset: shape.a_offset,
        };
        let lb = Layout {
            shape: [shape.batches, k, n][..].into(),
            strides: [batch(shape.stride_b), br, bc][..].into(),
            offset: shape.b_offset,
        };
        let f32s = |w: &CudaBuffer| -> Result<Vec<f32>> {
            Ok(self
                .read(w.host_words()?)
                .into_iter()
                .map(f32::from_bits)
                .collect())
        };
        let (av, bv) = (f32s(a)?, f32s(b)?);
        let (product, _) = crate::cpu::matmul(&av, &la, &bv, &lb)
            .map_err(|e| GpuError::Call(format!("the CPU stand-in's GEMM: {e}")))?;
        let out = c.host_words()?;
        let _order = self.lock();
        for (batch, values) in product.chunks(m * n).enumerate() {
            let at = batch * shape.stride_c;
            for (i, v) in values.iter().enumerate() {
                // SAFETY: the caller's `check_gemm` put every batch's `m * n` values inside
                // `c`; the lock is held.
                unsafe { *out.ptr().add(at + i) = v.to_bits() };
            }
        }
        Ok(())
    }
}
