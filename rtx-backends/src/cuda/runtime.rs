//! The CUDA runtime: one device, one stream, the kernels `rtx_ir::emit` writes for the fusion
//! plan loaded from their cubins, and cuBLAS for the products.
//!
//! - The driver (`libcuda`) and cuBLAS are loaded at run time by cudarc (`dynamic-loading`),
//!   so building needs no toolkit; [`CudaDevice::open`] on a machine without them, or
//!   without a GPU, is an error that says which is missing.
//! - Everything runs in order on one stream, so cudarc's per-buffer event tracking (two
//!   events per allocation, for multi-stream use) is turned off.
//! - Buffers come from the stream-ordered allocator (`cuMemAllocAsync`) with the device's
//!   default memory pool told to keep what is freed (release threshold at its maximum): a
//!   freed buffer's memory serves the next allocation without a driver allocation or a
//!   synchronization, the caching PyTorch's allocator does by hand.
//! - Kernels are compiled for the device's own architecture through the persistent cache
//!   (`compile_cached`), then loaded once per process and looked up by source hash.
//! - Host reads synchronize the stream; nothing else waits.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    DriverError, LaunchConfig, PushKernelArg, ValidAsZeroBits, sys as driver_sys,
};
use cudarc::nvrtc::Ptx;

use super::{GpuError, Result, compile_cached};
use crate::kernel_cache::KernelCache;

const DRIVER_HELP: &str = "the CUDA runtime needs an NVIDIA driver (libcuda.so) and a GPU";
const CUBLAS_HELP: &str = "install the wheel `nvidia-cublas-cu12` and put \
     site-packages/nvidia/cublas/lib on LD_LIBRARY_PATH";

/// A kernel to run: its CUDA C source (one translation unit), entry point and a name for
/// errors, as `rtx_ir::emit::KernelSource` gives them.
#[derive(Clone, Copy, Debug)]
pub struct CudaKernel<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub entry: &'a str,
}

/// `len` values of `T` on a [`CudaDevice`]; freed (into the device's pool) on drop.
pub struct CudaBuffer<T> {
    slice: CudaSlice<T>,
}

impl<T> CudaBuffer<T> {
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

/// One parameter of a kernel after its meta words.
pub enum Arg<'a> {
    /// Values the kernel reads.
    In(&'a CudaBuffer<f32>),
    /// u32 indices the kernel reads.
    Index(&'a CudaBuffer<u32>),
    /// Values the kernel writes.
    Out(&'a mut CudaBuffer<f32>),
    /// u32 indices the kernel writes.
    IndexOut(&'a mut CudaBuffer<u32>),
}

/// A row-major product `C[m, n] = A[m, k] @ B[k, n]` for cuBLAS, `batches` times with the
/// given element strides between matrices (0: one matrix for every batch). `a_transposed`:
/// A is stored as `[k, m]`; `b_transposed`: B as `[n, k]` (a Linear's weight).
#[derive(Clone, Copy, Debug)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
    pub batches: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl GemmShape {
    /// One product of contiguous row-major matrices.
    pub fn plain(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            a_transposed: false,
            b_transposed: false,
            batches: 1,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
        }
    }
}

/// One CUDA device with its stream, cuBLAS handle and loaded kernels.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    name: String,
    arch: String,
    cache: KernelCache,
    functions: Mutex<HashMap<u64, CudaFunction>>,
}

fn call(what: &str) -> impl Fn(DriverError) -> GpuError + '_ {
    move |e| GpuError::Call(format!("{what}: {e:?}"))
}

/// `requested` bytes could not be allocated, or another driver failure.
fn alloc_error(requested: u64) -> impl Fn(DriverError) -> GpuError {
    move |e| {
        if e.0 == driver_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            GpuError::OutOfMemory { requested }
        } else {
            GpuError::Call(format!("allocating {requested} bytes: {e:?}"))
        }
    }
}

/// Whether the driver library loads and sees at least one GPU.
pub fn cuda_available() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    if !unsafe { driver_sys::is_culib_present() } {
        return false;
    }
    CudaContext::device_count().is_ok_and(|n| n > 0)
}

impl CudaDevice {
    /// GPU `ordinal` (0 for the first), with its primary context and default stream.
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        // SAFETY: only try to open the libraries by their candidate names; cudarc panics on a
        // first call into a library it cannot load, so both are checked before any call.
        if !unsafe { driver_sys::is_culib_present() } {
            return Err(GpuError::MissingLibrary {
                library: "libcuda",
                help: DRIVER_HELP,
            });
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(GpuError::MissingLibrary {
                library: "libcublas",
                help: CUBLAS_HELP,
            });
        }
        let count = CudaContext::device_count().map_err(call("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(GpuError::Call(format!(
                "CUDA device {ordinal} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(call("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: this device uses one stream only, so no buffer is ever used on another
        // stream than the one it was allocated on.
        unsafe { ctx.disable_event_tracking() };
        keep_freed_memory(&ctx)?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(call("cuDeviceGetAttribute"))?;
        let name = ctx.name().map_err(call("cuDeviceGetName"))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(Arc::clone(&stream))
            .map_err(|e| GpuError::Call(format!("cublasCreate: {e:?}")))?;
        Ok(CudaDevice {
            ctx,
            stream,
            blas,
            name,
            arch: format!("sm_{major}{minor}"),
            cache: KernelCache::default_location(),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The GPU's name and architecture, e.g. `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// The architecture kernels are compiled for, e.g. `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// A buffer holding `data`.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaBuffer<T>> {
        let bytes = std::mem::size_of_val(data) as u64;
        let slice = self.stream.clone_htod(data).map_err(alloc_error(bytes))?;
        Ok(CudaBuffer { slice })
    }

    /// A buffer of `len` zeros.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaBuffer<T>> {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let slice = self.stream.alloc_zeros(len).map_err(alloc_error(bytes))?;
        Ok(CudaBuffer { slice })
    }

    /// The values of `buf`, copied back once the stream's earlier work is done.
    pub fn read<T: DeviceRepr + Default + Clone>(&self, buf: &CudaBuffer<T>) -> Result<Vec<T>> {
        let out = self
            .stream
            .clone_dtoh(&buf.slice)
            .map_err(call("cuMemcpyDtoHAsync"))?;
        self.synchronize()?;
        Ok(out)
    }

    /// Copies `src` into `dst` (the same length) on the stream.
    pub fn copy(&self, src: &CudaBuffer<f32>, dst: &mut CudaBuffer<f32>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(GpuError::Call(format!(
                "copy of {} values into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        self.stream
            .memcpy_dtod(&src.slice, &mut dst.slice)
            .map_err(call("cuMemcpyDtoDAsync"))
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(call("cuStreamSynchronize"))
    }

    /// `kernel` compiled for this device (or found in the disk cache) and loaded, once per
    /// process.
    fn function(&self, kernel: &CudaKernel) -> Result<CudaFunction> {
        let mut h = DefaultHasher::new();
        (kernel.source, kernel.entry).hash(&mut h);
        let key = h.finish();
        if let Some(f) = self
            .functions
            .lock()
            .ok()
            .and_then(|c| c.get(&key).cloned())
        {
            return Ok(f);
        }
        let compiled = compile_cached(&self.cache, kernel.name, kernel.source, &self.arch, &[])?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(|e| GpuError::Compile {
                name: kernel.name.to_string(),
                message: format!("cuModuleLoadData: {e:?}"),
            })?;
        let f = module
            .load_function(kernel.entry)
            .map_err(|e| GpuError::Compile {
                name: kernel.name.to_string(),
                message: format!("no entry `{}`: {e:?}", kernel.entry),
            })?;
        if let Ok(mut c) = self.functions.lock() {
            c.insert(key, f.clone());
        }
        Ok(f)
    }

    /// Compiles and loads `kernel` without running it.
    pub fn load(&self, kernel: &CudaKernel) -> Result<()> {
        self.function(kernel).map(|_| ())
    }

    /// Runs an emitted pointwise or row kernel (`rtx_ir::emit`: parameters meta, inputs,
    /// outputs) over `threads` threads, `group` per block (`POINTWISE_GROUP` or
    /// `ROWS_GROUP`, which the kernel's index arithmetic assumes).
    pub fn run_emitted(
        &self,
        kernel: &CudaKernel,
        meta: &[u32],
        inputs: &[&CudaBuffer<f32>],
        outputs: &mut [&mut CudaBuffer<f32>],
        threads: usize,
        group: u32,
    ) -> Result<()> {
        let mut args: Vec<Arg> = inputs.iter().map(|b| Arg::In(b)).collect();
        args.extend(outputs.iter_mut().map(|b| Arg::Out(b)));
        self.run_kernel(kernel, meta, &mut args, threads, group)
    }

    /// Runs `kernel` (parameters: the meta words, then `args` in order) over `threads`
    /// threads, `group` per block, on a grid over x and then y.
    pub fn run_kernel(
        &self,
        kernel: &CudaKernel,
        meta: &[u32],
        args: &mut [Arg],
        threads: usize,
        group: u32,
    ) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        let f = self.function(kernel)?;
        let meta = self.upload(meta)?;
        let blocks = threads.div_ceil(group.max(1) as usize);
        // The kernels' index is (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x.
        let x = blocks.min(i32::MAX as usize);
        let y = blocks.div_ceil(x);
        if y > 65535 {
            return Err(GpuError::Call(format!(
                "`{}`: {threads} threads need more than {} blocks",
                kernel.name,
                x * 65535
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (x as u32, y as u32, 1),
            block_dim: (group, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&meta.slice);
        for arg in args.iter_mut() {
            match arg {
                Arg::In(b) => launch.arg(&b.slice),
                Arg::Index(b) => launch.arg(&b.slice),
                Arg::Out(b) => launch.arg(&mut b.slice),
                Arg::IndexOut(b) => launch.arg(&mut b.slice),
            };
        }
        // SAFETY: the kernel takes exactly these pointers (meta, then `args`) with these
        // element types, and reads and writes only the elements its meta words describe,
        // which the caller sized the buffers for.
        unsafe { launch.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::Call(format!("`{}`: {e:?}", kernel.name)))
    }

    /// `c = a @ b` in f32 through cuBLAS (`cublasSgemm`, strided-batched for several).
    pub fn gemm_f32(
        &self,
        shape: GemmShape,
        a: &CudaBuffer<f32>,
        b: &CudaBuffer<f32>,
        c: &mut CudaBuffer<f32>,
    ) -> Result<()> {
        let s = check_gemm(shape, a.len(), b.len(), c.len())?;
        let gemm = GemmConfig {
            transa: s.op_first,
            transb: s.op_second,
            m: s.m,
            n: s.n,
            k: s.k,
            alpha: 1.0f32,
            lda: s.ld_first,
            ldb: s.ld_second,
            beta: 0.0f32,
            ldc: s.ldc,
        };
        // SAFETY: `check_gemm` checked that every matrix of every batch lies inside its
        // buffer at these leading dimensions and strides.
        let done = unsafe {
            if shape.batches == 1 {
                self.blas.gemm(gemm, &b.slice, &a.slice, &mut c.slice)
            } else {
                self.blas.gemm_strided_batched(
                    StridedBatchedConfig {
                        gemm,
                        batch_size: s.batches,
                        stride_a: shape.stride_b as i64,
                        stride_b: shape.stride_a as i64,
                        stride_c: shape.stride_c as i64,
                    },
                    &b.slice,
                    &a.slice,
                    &mut c.slice,
                )
            }
        };
        done.map_err(|e| GpuError::Call(format!("cublasSgemm: {e:?}")))
    }

    /// `c = a @ b` with bf16 operands and result (raw bf16 bits) and f32 accumulation, on
    /// the tensor cores (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`): what `torch.matmul` runs for
    /// bfloat16 tensors.
    pub fn gemm_bf16(
        &self,
        shape: GemmShape,
        a: &CudaBuffer<u16>,
        b: &CudaBuffer<u16>,
        c: &mut CudaBuffer<u16>,
    ) -> Result<()> {
        use cudarc::cublas::{result, sys};
        let s = check_gemm(shape, a.len(), b.len(), c.len())?;
        if shape.batches != 1 {
            return Err(GpuError::Call(
                "batched bf16 products are not supported yet".into(),
            ));
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (pa, _ra) = a.slice.device_ptr(&self.stream);
        let (pb, _rb) = b.slice.device_ptr(&self.stream);
        let (pc, _rc) = c.slice.device_ptr_mut(&self.stream);
        // SAFETY: as for `gemm_f32`; the pointers stay valid while the guards live, and
        // alpha and beta are f32 as CUBLAS_COMPUTE_32F requires.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                s.op_first,
                s.op_second,
                s.m,
                s.n,
                s.k,
                (&alpha) as *const f32 as *const _,
                pb as *const _,
                sys::cudaDataType_t::CUDA_R_16BF,
                s.ld_first,
                pa as *const _,
                sys::cudaDataType_t::CUDA_R_16BF,
                s.ld_second,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                sys::cudaDataType_t::CUDA_R_16BF,
                s.ldc,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::Call(format!("cublasGemmEx (bf16): {e:?}")))
    }

    /// Milliseconds the stream spends on `f`'s work, between two events recorded around it.
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let start = self
            .stream
            .record_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(call("cuEventRecord"))?;
        f()?;
        let end = self
            .stream
            .record_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(call("cuEventRecord"))?;
        end.synchronize().map_err(call("cuEventSynchronize"))?;
        start.elapsed_ms(&end).map_err(call("cuEventElapsedTime"))
    }
}

/// The device's default memory pool keeps freed memory for later allocations instead of
/// returning it to the driver at each synchronization (its default threshold is 0).
fn keep_freed_memory(ctx: &CudaContext) -> Result<()> {
    let mut pool: driver_sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is writable; the device handle is the context's.
    unsafe { driver_sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(call("cuDeviceGetDefaultMemPool"))?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold attribute takes a pointer to a u64.
    unsafe {
        driver_sys::cuMemPoolSetAttribute(
            pool,
            driver_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold) as *mut u64 as *mut _,
        )
    }
    .result()
    .map_err(call("cuMemPoolSetAttribute"))
}

/// A row-major product as cuBLAS's column-major call: `C^T = B^T A^T`, so B is the first
/// operand and A the second.
struct ColumnMajor {
    op_first: cudarc::cublas::sys::cublasOperation_t,
    op_second: cudarc::cublas::sys::cublasOperation_t,
    m: i32,
    n: i32,
    k: i32,
    ld_first: i32,
    ld_second: i32,
    ldc: i32,
    batches: i32,
}

/// Checks that every matrix of `shape` lies inside buffers of `a`, `b` and `c` values and
/// that cuBLAS's 32-bit sizes hold it, and gives the column-major call.
fn check_gemm(shape: GemmShape, a: usize, b: usize, c: usize) -> Result<ColumnMajor> {
    use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    let GemmShape { m, n, k, .. } = shape;
    let fits = |len: usize, stride: usize, size: usize| {
        shape
            .batches
            .checked_sub(1)
            .and_then(|last| last.checked_mul(stride))
            .and_then(|first| first.checked_add(size))
            .is_some_and(|end| end <= len)
    };
    let int = |v: usize| i32::try_from(v).ok();
    let (Some(mi), Some(ni), Some(ki), Some(bi)) = (int(m), int(n), int(k), int(shape.batches))
    else {
        return Err(GpuError::Call(format!(
            "product {m}x{k}x{n} ({} batches) exceeds cuBLAS's 32-bit sizes",
            shape.batches
        )));
    };
    if shape.batches == 0
        || !fits(a, shape.stride_a, m * k)
        || !fits(b, shape.stride_b, k * n)
        || !fits(c, shape.stride_c, m * n)
    {
        return Err(GpuError::Call(format!(
            "product {m}x{k}x{n} over {} batches does not fit buffers of {a}, {b} and {c} values",
            shape.batches
        )));
    }
    Ok(ColumnMajor {
        // B row-major [k, n] is column-major [n, k] (leading dimension n); stored as [n, k]
        // it is column-major [k, n], transposed.
        op_first: if shape.b_transposed {
            CUBLAS_OP_T
        } else {
            CUBLAS_OP_N
        },
        ld_first: if shape.b_transposed { ki } else { ni },
        op_second: if shape.a_transposed {
            CUBLAS_OP_T
        } else {
            CUBLAS_OP_N
        },
        ld_second: if shape.a_transposed { mi } else { ki },
        m: ni,
        n: mi,
        k: ki,
        ldc: ni,
        batches: bi,
    })
}

#[cfg(test)]
mod tests {
    use super::{GemmShape, check_gemm};

    #[test]
    fn a_row_major_product_becomes_the_transposed_column_major_call() {
        let s = check_gemm(GemmShape::plain(3, 5, 7), 21, 35, 15).unwrap();
        assert_eq!((s.m, s.n, s.k), (5, 3, 7));
        assert_eq!((s.ld_first, s.ld_second, s.ldc), (5, 7, 5));
        let t = GemmShape {
            a_transposed: true,
            b_transposed: true,
            ..GemmShape::plain(3, 5, 7)
        };
        let s = check_gemm(t, 21, 35, 15).unwrap();
        assert_eq!((s.ld_first, s.ld_second), (7, 3));
    }

    #[test]
    fn a_product_past_its_buffers_is_refused() {
        assert!(check_gemm(GemmShape::plain(3, 5, 7), 20, 35, 15).is_err());
        let batched = GemmShape {
            batches: 2,
            ..GemmShape::plain(3, 5, 7)
        };
        assert!(check_gemm(batched, 42, 70, 29).is_err());
        assert!(check_gemm(batched, 42, 70, 30).is_ok());
        assert!(check_gemm(GemmShape::plain(1 << 31, 1, 1), usize::MAX, 1, usize::MAX).is_err());
    }
}
