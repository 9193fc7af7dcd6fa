//! The CUDA runtime: one device, one stream, the kernels `rtx_ir::emit` writes for the fusion
//! plan loaded from their cubins, and cuBLAS for the products (`gemm.rs`).
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
//!
//! [`CudaDevice::open_hip`] (cargo feature `hip`) is the same device on an AMD GPU: the
//! HIP runtime (`hip/runtime.rs`) in place of the driver, hiprtc in place of NVRTC, and the
//! tiled GEMM of `gemm_tiled.rs` in place of cuBLAS.
//!
//! [`CudaDevice::on_cpu`] is the same device with its kernels run on the CPU instead
//! (`host.rs`: the CUDA C built by `c++` under a shim, every thread in turn, and the CPU's
//! GEMM for cuBLAS's products), so every path above the driver calls, rtx-core's executor
//! included, is tested on machines without a GPU.

// One file, a little past 600 lines: every method of `CudaDevice` here is one match over its
// three runners (driver, CPU stand-in, HIP), and keeping those arms side by side is what
// keeps the runners in step; the runners' own code lives in `host.rs` and `hip/runtime.rs`.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg, sys as driver_sys,
};
use cudarc::nvrtc::Ptx;

use super::host::{Host, HostWords};
use super::{GpuError, Result, compile_cached};
#[cfg(feature = "hip")]
use crate::hip::{HipDriver, HipSlice};
use crate::kernel_cache::KernelCache;
use crate::launch_abi::LaunchMeta;

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

/// `len` 32-bit words on a [`CudaDevice`] (f32 values, u32 indices, or bf16 pairs), as
/// a wgpu buffer holds them; freed (into the device's pool) on drop. Kernels take buffers
/// by shared reference, like wgpu's: device memory is not Rust memory, and every launch
/// runs in order on the one stream, so a kernel's writes never race a later read.
pub struct CudaBuffer {
    words: Words,
}

enum Words {
    Device(CudaSlice<u32>),
    /// On a device that runs its kernels on the CPU.
    Host(HostWords),
    /// On an AMD GPU, `len` words.
    #[cfg(feature = "hip")]
    Hip(HipSlice, usize),
}

impl CudaBuffer {
    pub fn len(&self) -> usize {
        match &self.words {
            Words::Device(s) => s.len(),
            Words::Host(h) => h.len(),
            #[cfg(feature = "hip")]
            Words::Hip(_, len) => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn device_slice(&self) -> Result<&CudaSlice<u32>> {
        match &self.words {
            Words::Device(s) => Ok(s),
            _ => Err(self.elsewhere("an NVIDIA GPU")),
        }
    }

    pub(super) fn host_words(&self) -> Result<&HostWords> {
        match &self.words {
            Words::Host(h) => Ok(h),
            _ => Err(self.elsewhere("the CPU stand-in")),
        }
    }

    #[cfg(feature = "hip")]
    fn hip_slice(&self) -> Result<&HipSlice> {
        match &self.words {
            Words::Hip(h, _) => Ok(h),
            _ => Err(self.elsewhere("an AMD GPU")),
        }
    }

    /// The error for this buffer handed to a device of another kind (`to`).
    fn elsewhere(&self, to: &str) -> GpuError {
        let here = match &self.words {
            Words::Device(_) => "an NVIDIA GPU",
            Words::Host(_) => "the CPU stand-in",
            #[cfg(feature = "hip")]
            Words::Hip(..) => "an AMD GPU",
        };
        GpuError::Call(format!("a buffer of {here} given to {to}"))
    }
}

/// One parameter of a kernel after its meta words (which side of the kernel it is on, for
/// the reader: both are pointers).
pub enum Arg<'a> {
    /// Values or indices the kernel reads.
    In(&'a CudaBuffer),
    /// Values or indices the kernel writes.
    Out(&'a CudaBuffer),
}

impl Arg<'_> {
    fn buffer(&self) -> &CudaBuffer {
        match self {
            Arg::In(b) | Arg::Out(b) => b,
        }
    }
}

/// One CUDA device with its stream, cuBLAS handle and loaded kernels (or the CPU standing in
/// for them, [`CudaDevice::on_cpu`]).
pub struct CudaDevice {
    runner: Runner,
    ordinal: usize,
    name: String,
    arch: String,
}

/// What runs a device's work.
pub(super) enum Runner {
    Driver(Driver),
    Host(Host),
    /// An AMD GPU through the HIP runtime (`CudaDevice::open_hip`).
    #[cfg(feature = "hip")]
    Hip(HipDriver),
}

/// A GPU through the driver: its context, stream, cuBLAS handle and loaded kernels.
pub(super) struct Driver {
    ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    cache: KernelCache,
    functions: Mutex<HashMap<u64, CudaFunction>>,
}

// SAFETY: `LaunchMeta` is `repr(C)` plain words, the layout of `rtx_meta` in `LAUNCH_ABI`.
unsafe impl cudarc::driver::DeviceRepr for LaunchMeta {}

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
            runner: Runner::Driver(Driver {
                ctx,
                stream,
                blas,
                cache: KernelCache::default_location(),
                functions: Mutex::new(HashMap::new()),
            }),
            ordinal,
            name,
            arch: format!("sm_{major}{minor}"),
        })
    }

    /// A device whose kernels run on this CPU (see the module's docs): the host's `c++`
    /// builds each kernel under a CUDA shim and runs its grid thread by thread, and the CPU's
    /// GEMM computes what cuBLAS would. For tests on machines without a GPU; slow, and it
    /// refuses kernels that share memory between threads. Without a C++ compiler it is
    /// `GpuError::MissingLibrary`.
    pub fn on_cpu() -> Result<CudaDevice> {
        Self::host(Host::open(false)?)
    }

    /// [`CudaDevice::on_cpu`] with its products run by the tiled GEMM kernel of
    /// `gemm_tiled.rs` (on the CPU, a block's threads side by side) instead of the CPU's GEMM:
    /// everything a HIP device ([`CudaDevice::open_hip`]) launches, so that path's values
    /// are checked on machines without an AMD GPU. Slower still than `on_cpu`.
    pub fn on_cpu_as_hip() -> Result<CudaDevice> {
        Self::host(Host::open(true)?)
    }

    fn host(host: Host) -> Result<CudaDevice> {
        let name = host.describe();
        Ok(CudaDevice {
            runner: Runner::Host(host),
            ordinal: 0,
            name,
            arch: "cpu".into(),
        })
    }

    /// AMD GPU `ordinal` (0 for the first) through the HIP runtime (`hip/runtime.rs`): the
    /// same kernels compiled by hiprtc for its architecture, and the tiled GEMM of
    /// `gemm_tiled.rs` for the products. Without ROCm's `libamdhip64.so.5` it is
    /// `GpuError::MissingLibrary`; without an AMD GPU, an error saying so.
    #[cfg(feature = "hip")]
    pub fn open_hip(ordinal: usize) -> Result<CudaDevice> {
        let opened = HipDriver::open(ordinal)?;
        Ok(CudaDevice {
            runner: Runner::Hip(opened.driver),
            ordinal,
            name: opened.name,
            arch: opened.arch,
        })
    }

    /// Whether this device is an AMD GPU driven through HIP ([`CudaDevice::open_hip`]).
    pub fn is_hip(&self) -> bool {
        #[cfg(feature = "hip")]
        if let Runner::Hip(_) = self.runner {
            return true;
        }
        false
    }

    pub(super) fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Whether the CPU runs this device's kernels ([`CudaDevice::on_cpu`]).
    pub fn is_on_cpu(&self) -> bool {
        matches!(self.runner, Runner::Host(_))
    }

    /// The GPU's name and architecture, e.g. `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// Which GPU of the machine this is (0 for the first).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The architecture kernels are compiled for, e.g. `sm_90` (`cpu` on the stand-in).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    fn upload_words(&self, words: &[u32]) -> Result<CudaBuffer> {
        let words = match &self.runner {
            Runner::Driver(d) => {
                let bytes = std::mem::size_of_val(words) as u64;
                Words::Device(d.stream.clone_htod(words).map_err(alloc_error(bytes))?)
            }
            Runner::Host(_) => Words::Host(HostWords::new(words.to_vec())),
            #[cfg(feature = "hip")]
            Runner::Hip(h) => Words::Hip(h.upload(words)?, words.len()),
        };
        Ok(CudaBuffer { words })
    }

    /// A buffer holding `data`.
    pub fn upload_f32(&self, data: &[f32]) -> Result<CudaBuffer> {
        let words: Vec<u32> = data.iter().map(|v| v.to_bits()).collect();
        self.upload_words(&words)
    }

    /// A buffer holding `data` (indices, meta words).
    pub fn upload_u32(&self, data: &[u32]) -> Result<CudaBuffer> {
        self.upload_words(data)
    }

    /// A buffer holding bf16 values (raw bits), two per word, the last word padded with 0.
    pub fn upload_bf16(&self, data: &[u16]) -> Result<CudaBuffer> {
        let words: Vec<u32> = data
            .chunks(2)
            .map(|p| u32::from(p[0]) | (u32::from(p.get(1).copied().unwrap_or(0)) << 16))
            .collect();
        self.upload_words(&words)
    }

    /// A buffer of `len` zero words.
    pub fn zeros(&self, len: usize) -> Result<CudaBuffer> {
        let bytes = (len as u64).saturating_mul(4);
        let words = match &self.runner {
            Runner::Driver(d) => {
                Words::Device(d.stream.alloc_zeros(len).map_err(alloc_error(bytes))?)
            }
            Runner::Host(_) => Words::Host(HostWords::zeros(len)?),
            #[cfg(feature = "hip")]
            Runner::Hip(h) => Words::Hip(h.zeros(len)?, len),
        };
        Ok(CudaBuffer { words })
    }

    /// The words of `buf`, copied back once the stream's earlier work is done.
    pub fn read_u32(&self, buf: &CudaBuffer) -> Result<Vec<u32>> {
        match &self.runner {
            Runner::Driver(d) => {
                let out = d
                    .stream
                    .clone_dtoh(buf.device_slice()?)
                    .map_err(call("cuMemcpyDtoHAsync"))?;
                self.synchronize()?;
                Ok(out)
            }
            Runner::Host(h) => Ok(h.read(buf.host_words()?)),
            #[cfg(feature = "hip")]
            Runner::Hip(h) => h.read(buf.hip_slice()?, buf.len()),
        }
    }

    /// The values of `buf` as f32.
    pub fn read_f32(&self, buf: &CudaBuffer) -> Result<Vec<f32>> {
        Ok(self
            .read_u32(buf)?
            .into_iter()
            .map(f32::from_bits)
            .collect())
    }

    /// The first `len` bf16 values (raw bits) of `buf`.
    pub fn read_bf16(&self, buf: &CudaBuffer, len: usize) -> Result<Vec<u16>> {
        let words = self.read_u32(buf)?;
        Ok(words
            .iter()
            .flat_map(|w| [*w as u16, (*w >> 16) as u16])
            .take(len)
            .collect())
    }

    /// Copies `src` into `dst` (the same length) on the stream.
    pub fn copy(&self, src: &CudaBuffer, dst: &CudaBuffer) -> Result<()> {
        if src.len() != dst.len() {
            return Err(GpuError::Call(format!(
                "copy of {} words into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        let d = match &self.runner {
            Runner::Driver(d) => d,
            Runner::Host(h) => {
                h.copy(src.host_words()?, dst.host_words()?);
                return Ok(());
            }
            #[cfg(feature = "hip")]
            Runner::Hip(h) => return h.copy(src.hip_slice()?, dst.hip_slice()?, src.len()),
        };
        let (from, _r) = src.device_slice()?.device_ptr(&d.stream);
        let (to, _w) = dst.device_slice()?.device_ptr(&d.stream);
        // SAFETY: both buffers hold `len` words (checked above) and stay alive while the
        // guards do; the copy is ordered on the stream with every other use of them.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(to, from, src.len() * 4, d.stream.cu_stream())
        }
        .map_err(call("cuMemcpyDtoDAsync"))
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        match &self.runner {
            Runner::Driver(d) => d.stream.synchronize().map_err(call("cuStreamSynchronize")),
            Runner::Host(_) => Ok(()),
            #[cfg(feature = "hip")]
            Runner::Hip(h) => h.synchronize(),
        }
    }

    /// `kernel` compiled for this device (or found in the disk cache) and loaded, once per
    /// process.
    fn function(&self, d: &Driver, kernel: &CudaKernel) -> Result<CudaFunction> {
        let mut h = DefaultHasher::new();
        (kernel.source, kernel.entry).hash(&mut h);
        let key = h.finish();
        if let Some(f) = d.functions.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(f);
        }
        let compiled = compile_cached(&d.cache, kernel.name, kernel.source, &self.arch, &[])?;
        let module = d
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
        if let Ok(mut c) = d.functions.lock() {
            c.insert(key, f.clone());
        }
        Ok(f)
    }

    /// Compiles and loads `kernel` without running it.
    pub fn load(&self, kernel: &CudaKernel) -> Result<()> {
        match &self.runner {
            Runner::Driver(d) => self.function(d, kernel).map(|_| ()),
            Runner::Host(h) => h.build(kernel),
            #[cfg(feature = "hip")]
            Runner::Hip(h) => h.load(kernel.name, kernel.source, kernel.entry, &self.arch),
        }
    }

    /// Runs an emitted pointwise or row kernel (`rtx_ir::emit`: parameters meta, inputs,
    /// outputs) over `threads` threads, `group` per block (`POINTWISE_GROUP` or
    /// `ROWS_GROUP`, which the kernel's index arithmetic assumes).
    pub fn run_emitted(
        &self,
        kernel: &CudaKernel,
        meta: &[u32],
        inputs: &[&CudaBuffer],
        outputs: &[&CudaBuffer],
        threads: usize,
        group: u32,
    ) -> Result<()> {
        let mut args: Vec<Arg> = inputs.iter().map(|b| Arg::In(b)).collect();
        args.extend(outputs.iter().map(|b| Arg::Out(b)));
        self.run_kernel(kernel, meta, &args, threads, group)
    }

    /// Runs `kernel` (parameters: the meta words, then `args` in order) over `threads`
    /// threads, `group` per block, on a grid over x and then y.
    pub fn run_kernel(
        &self,
        kernel: &CudaKernel,
        meta: &[u32],
        args: &[Arg],
        threads: usize,
        group: u32,
    ) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
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
        let d = match &self.runner {
            Runner::Driver(d) => d,
            Runner::Host(h) => {
                let buffers = args
                    .iter()
                    .map(|a| a.buffer().host_words())
                    .collect::<Result<Vec<_>>>()?;
                return h.launch(kernel, meta, &buffers, [x as u32, y as u32], group);
            }
            #[cfg(feature = "hip")]
            Runner::Hip(h) => {
                let pointers = args
                    .iter()
                    .map(|a| a.buffer().hip_slice().map(HipSlice::ptr))
                    .collect::<Result<Vec<_>>>()?;
                let what = (kernel.name, kernel.source, kernel.entry);
                let grid = [x as u32, y as u32];
                return h.launch(what, &self.arch, meta, &pointers, grid, group);
            }
        };
        let f = self.function(d, kernel)?;
        let cfg = LaunchConfig {
            grid_dim: (x as u32, y as u32, 1),
            block_dim: (group, 1, 1),
            shared_mem_bytes: 0,
        };
        // Meta words travel in the launch's parameters; only longer ones take a buffer
        // (freed on the stream after the launch, so it lives as long as the kernel needs).
        let (launch_meta, _spill) = match LaunchMeta::inline(meta) {
            Some(inline) => (inline, None),
            None => {
                let buffer = self.upload_u32(meta)?;
                let ptr = buffer.device_slice()?.device_ptr(&d.stream).0;
                (LaunchMeta::spilled(ptr), Some(buffer))
            }
        };
        // Raw device pointers, so that buffers written are taken by shared reference (the
        // guards do nothing with event tracking off, and live until the launch is queued).
        let slices = args
            .iter()
            .map(|a| a.buffer().device_slice())
            .collect::<Result<Vec<_>>>()?;
        let pointers: Vec<_> = slices.iter().map(|s| s.device_ptr(&d.stream)).collect();
        let mut launch = d.stream.launch_builder(&f);
        launch.arg(&launch_meta);
        for (ptr, _) in &pointers {
            launch.arg(ptr);
        }
        // SAFETY: the kernel takes exactly these parameters (`RTX_META` of `LAUNCH_ABI`, whose
        // struct `LaunchMeta` is, then `args`' pointers), and reads and writes only the
        // elements its meta words describe, which the caller sized the buffers for.
        unsafe { launch.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::Call(format!("`{}`: {e:?}", kernel.name)))
    }

    /// Milliseconds the stream spends on `f`'s work, between two events recorded around it
    /// (on the CPU stand-in, the wall time of `f`).
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let d = match &self.runner {
            Runner::Driver(d) => d,
            Runner::Host(_) => {
                let t = std::time::Instant::now();
                f()?;
                return Ok(t.elapsed().as_secs_f32() * 1e3);
            }
            #[cfg(feature = "hip")]
            Runner::Hip(h) => return h.time_ms(f),
        };
        let start = d
            .stream
            .record_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(call("cuEventRecord"))?;
        f()?;
        let end = d
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
