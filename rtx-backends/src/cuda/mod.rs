//! The CUDA backend (cargo feature `cuda`).
//!
//! - The compiler: CUDA C kernels emitted from the fusion plan (`rtx_ir::emit`,
//!   `Target::Cuda`) compiled by NVRTC to PTX and to a cubin for one architecture, through a
//!   persistent disk cache ([`compile_cached`]). NVRTC needs no GPU and no driver, so CI
//!   compiles every kernel of every model for `sm_90` (the H200) on a machine without either.
//! - The runtime (`runtime.rs`, [`CudaDevice`]): one device and stream, buffers from the
//!   driver's caching pool, emitted kernels launched from their cubins, cuBLAS for products
//!   (f32, and bf16 on the tensor cores). It runs only where a GPU is; without one,
//!   [`CudaDevice::open`] says what is missing.
//! - `kernels.rs`: the core ops' own kernels (reductions, gathers, scatters, strided copies),
//!   the wgpu backend's in CUDA C over the same meta words (`kernel_meta`); `attention.rs`
//!   the attention forward and backward kernels, `window.rs` convolution and pooling.
//! - `gemm.rs`: row-major products (strided, transposed, batched views) as cuBLAS calls;
//!   `gemm_tiled.rs` the same contract as a shared-memory kernel of our own (for HIP).
//! - `on_cpu.rs`: the same kernels built for this CPU by a C++ compiler and run thread by
//!   thread, so tests check the CUDA text's values without a GPU; `host.rs` makes that a
//!   whole device ([`CudaDevice::on_cpu`]: host buffers, the CPU's GEMM for cuBLAS), so
//!   rtx-core's executor runs its CUDA path in CI.
//!
//! cudarc loads `libnvrtc`, `libcuda` and `libcublas` at run time (`dynamic-loading`):
//! building needs no CUDA toolkit, and a machine without a library gets
//! [`GpuError::MissingLibrary`]. The pip wheels `nvidia-cuda-nvrtc-cu12` and
//! `nvidia-cublas-cu12` have the toolkit libraries; put their `lib` folders on
//! `LD_LIBRARY_PATH`.

use std::ffi::{CString, c_char};

use cudarc::nvrtc::{result, sys};

pub use crate::gpu_error::{GpuError, Result};

pub mod attention;
mod gemm;
pub mod gemm_tiled;
mod host;
pub mod kernels;
pub mod on_cpu;
mod runtime;
pub mod window;
pub use gemm::GemmShape;
pub use kernels::CudaView;
pub use runtime::{Arg, CudaBuffer, CudaDevice, CudaKernel, cuda_available};

pub use crate::launch_abi::{LAUNCH_ABI, META_INLINE_WORDS};

const NVRTC_HELP: &str = "install the wheel `nvidia-cuda-nvrtc-cu12` and put \
     site-packages/nvidia/cuda_nvrtc/lib on LD_LIBRARY_PATH";

/// A kernel compiled for one architecture.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    pub name: String,
    /// The architecture it was compiled for, e.g. `sm_90`.
    pub arch: String,
    /// PTX text (loadable by any driver at least as new as this NVRTC).
    pub ptx: String,
    /// The cubin for `arch` (empty when `arch` is a virtual `compute_XX`).
    pub cubin: Vec<u8>,
}

/// Whether libnvrtc can be loaded on this machine.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(missing());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; both pointers are valid for writes.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| GpuError::Call(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

fn missing() -> GpuError {
    GpuError::MissingLibrary {
        library: "libnvrtc",
        help: NVRTC_HELP,
    }
}

/// Destroys the program on every path out of [`compile`].
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed once, here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `source` (one translation unit; `name` for errors) for `arch`: `sm_90` gives PTX
/// and a cubin, `compute_90` PTX only. Extra NVRTC options go in `options`.
pub fn compile(name: &str, source: &str, arch: &str, options: &[&str]) -> Result<CompiledKernel> {
    if !nvrtc_available() {
        return Err(missing());
    }
    let compile_error = |message: String| GpuError::Compile {
        name: name.to_string(),
        message,
    };
    let src = CString::new(format!("{LAUNCH_ABI}{source}"))
        .map_err(|_| compile_error("source holds a NUL byte".into()))?;
    let file = CString::new(format!("{name}.cu"))
        .map_err(|_| compile_error("name holds a NUL byte".into()))?;
    let program = Program(
        result::create_program(&src, Some(file.as_c_str()))
            .map_err(|e| compile_error(format!("nvrtcCreateProgram: {e:?}")))?,
    );
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    opts.extend(options.iter().map(|o| o.to_string()));
    // SAFETY: `program` is a live program; options are plain strings.
    if let Err(e) = unsafe { result::compile_program(program.0, &opts) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program.0) }
            .map(|l| text(&l))
            .unwrap_or_default();
        return Err(compile_error(format!("{e:?} with {opts:?}:\n{log}")));
    }
    // SAFETY: the program compiled.
    let ptx = unsafe { result::get_ptx(program.0) }
        .map_err(|e| compile_error(format!("nvrtcGetPTX: {e:?}")))?;
    let cubin = if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: the program compiled for a real architecture; `size` is writable.
        unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
            .result()
            .map_err(|e| compile_error(format!("nvrtcGetCUBINSize: {e:?}")))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds `size` bytes, as NVRTC asked.
        unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| compile_error(format!("nvrtcGetCUBIN: {e:?}")))?;
        cubin
    } else {
        Vec::new()
    };
    Ok(CompiledKernel {
        name: name.to_string(),
        arch: arch.to_string(),
        ptx: text(&ptx),
        cubin,
    })
}

/// [`compile`] through `cache`: an entry for the same source, launch ABI, architecture,
/// options and NVRTC version is loaded instead of compiled.
pub fn compile_cached(
    cache: &crate::kernel_cache::KernelCache,
    name: &str,
    source: &str,
    arch: &str,
    options: &[&str],
) -> Result<CompiledKernel> {
    let (major, minor) = nvrtc_version()?;
    let compiler = format!("nvrtc {major}.{minor}");
    let options_text = options.join(" ");
    let (ptx, cubin) = cache.get_or_compile(
        &[&compiler, arch, &options_text, LAUNCH_ABI, source],
        || compile(name, source, arch, options).map(|k| (k.ptx, k.cubin)),
    )?;
    Ok(CompiledKernel {
        name: name.to_string(),
        arch: arch.to_string(),
        ptx,
        cubin,
    })
}
