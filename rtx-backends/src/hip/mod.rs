//! The HIP backend (cargo feature `hip`, which brings `cuda` with it): the CUDA C kernels of
//! `rtx_ir::emit` behind `HIP_PRELUDE`, compiled by hiprtc to an AMD code object (ELF) for
//! one architecture, e.g. `gfx90a` (MI200), and run by `runtime.rs` on an AMD GPU as a
//! [`CudaDevice`](crate::cuda::CudaDevice) (`CudaDevice::open_hip`). hiprtc needs no GPU, so
//! CI compiles every kernel of every model on a machine without one.
//!
//! hiprtc lives in ROCm's `libamdhip64.so.5` (Debian: `libamdhip64-5`,
//! `libhiprtc-builtins5`), opened at run time; without it [`compile`] returns
//! [`GpuError::MissingLibrary`]. hiprtc 5.2 aborts the whole process for gfx1100, gfx1101,
//! gfx940 and gfx942 (`GPU.md`), so [`compile`] refuses those instead of calling it.

use std::ffi::{CString, c_char, c_int};
use std::sync::OnceLock;

use libloading::{Library, Symbol};

pub use crate::gpu_error::{GpuError, Result};

mod runtime;
pub use runtime::hip_available;
pub(crate) use runtime::{HipDriver, HipSlice};

const LIBRARY: &str = "libamdhip64.so.5";
const HELP: &str = "install Debian's `libamdhip64-5` and `libhiprtc-builtins5` (ROCm 5.2)";
/// Architectures whose compilation aborts inside hiprtc 5.2 rather than failing.
const ABORTING: [&str; 4] = ["gfx1100", "gfx1101", "gfx940", "gfx942"];

type Program = *mut std::ffi::c_void;
type Status = c_int;

fn library() -> Option<&'static Library> {
    static LIB: OnceLock<Option<Library>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: loading ROCm's runtime runs its initializers, which only set up its state.
        unsafe { Library::new(LIBRARY) }.ok()
    })
    .as_ref()
}

/// Whether hiprtc can be loaded on this machine.
pub fn hiprtc_available() -> bool {
    library().is_some()
}

/// A code object compiled for one AMD architecture.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    pub name: String,
    pub arch: String,
    /// The code object (an ELF), loadable with `hipModuleLoadData`.
    pub code: Vec<u8>,
}

struct Owned<'a> {
    program: Program,
    destroy: Symbol<'a, unsafe extern "C" fn(*mut Program) -> Status>,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        // SAFETY: created by hiprtcCreateProgram and destroyed once, here.
        unsafe { (self.destroy)(&mut self.program) };
    }
}

/// Compiles `source` (one translation unit; `name` for errors) for `arch` (`gfx90a`,
/// `gfx908`, `gfx1030`, ...). Extra hiprtc options go in `options`.
pub fn compile(name: &str, source: &str, arch: &str, options: &[&str]) -> Result<CompiledKernel> {
    let lib = library().ok_or(GpuError::MissingLibrary {
        library: "hiprtc (libamdhip64.so.5)",
        help: HELP,
    })?;
    let error = |message: String| GpuError::Compile {
        name: name.to_string(),
        message,
    };
    if ABORTING.contains(&arch) {
        return Err(error(format!(
            "hiprtc 5.2 aborts the process for {arch}; compile it offline with hipcc"
        )));
    }
    // One compile at a time in the process: hiprtc 5.2 (Debian's libamdhip64-5) crashed
    // (SIGSEGV) when two tests compiled at once, so its programs are not used concurrently.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let symbol = |e: libloading::Error| error(format!("hiprtc symbol missing: {e}"));
    // SAFETY: the signatures are hiprtc's (hiprtc.h, ROCm 5.2).
    let (create, compile_program, log_size, log, code_size, code, destroy) = unsafe {
        (
            lib.get::<unsafe extern "C" fn(
                *mut Program,
                *const c_char,
                *const c_char,
                c_int,
                *const *const c_char,
                *const *const c_char,
            ) -> Status>(b"hiprtcCreateProgram")
                .map_err(symbol)?,
            lib.get::<unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status>(
                b"hiprtcCompileProgram",
            )
            .map_err(symbol)?,
            lib.get::<unsafe extern "C" fn(Program, *mut usize) -> Status>(
                b"hiprtcGetProgramLogSize",
            )
            .map_err(symbol)?,
            lib.get::<unsafe extern "C" fn(Program, *mut c_char) -> Status>(b"hiprtcGetProgramLog")
                .map_err(symbol)?,
            lib.get::<unsafe extern "C" fn(Program, *mut usize) -> Status>(b"hiprtcGetCodeSize")
                .map_err(symbol)?,
            lib.get::<unsafe extern "C" fn(Program, *mut c_char) -> Status>(b"hiprtcGetCode")
                .map_err(symbol)?,
            lib.get::<unsafe extern "C" fn(*mut Program) -> Status>(b"hiprtcDestroyProgram")
                .map_err(symbol)?,
        )
    };
    let src = CString::new(format!("{}{source}", crate::launch_abi::LAUNCH_ABI))
        .map_err(|_| error("source holds a NUL byte".into()))?;
    let file =
        CString::new(format!("{name}.hip")).map_err(|_| error("name holds a NUL byte".into()))?;
    let mut program: Program = std::ptr::null_mut();
    // SAFETY: valid C strings; no headers.
    let status = unsafe {
        create(
            &mut program,
            src.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if status != 0 || program.is_null() {
        return Err(error(format!("hiprtcCreateProgram returned {status}")));
    }
    let owned = Owned { program, destroy };
    let mut opts = vec![format!("--offload-arch={arch}"), "-O3".to_string()];
    opts.extend(options.iter().map(|o| o.to_string()));
    let opts: Vec<CString> = opts
        .into_iter()
        .map(CString::new)
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| error("an option holds a NUL byte".into()))?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: a live program and `ptrs.len()` valid option strings.
    let status = unsafe { compile_program(owned.program, ptrs.len() as c_int, ptrs.as_ptr()) };
    if status != 0 {
        let mut size = 0usize;
        // SAFETY: a live program; the buffer is as large as hiprtc asked.
        let text = unsafe {
            log_size(owned.program, &mut size);
            let mut buf = vec![0 as c_char; size.max(1)];
            log(owned.program, buf.as_mut_ptr());
            let bytes: Vec<u8> = buf
                .iter()
                .map(|&c| c as u8)
                .take_while(|&b| b != 0)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        return Err(error(format!("hiprtc status {status} for {arch}:\n{text}")));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; the buffer is as large as hiprtc asked.
    let bytes = unsafe {
        if code_size(owned.program, &mut size) != 0 {
            return Err(error("hiprtcGetCodeSize failed".into()));
        }
        let mut buf = vec![0u8; size];
        if code(owned.program, buf.as_mut_ptr().cast()) != 0 {
            return Err(error("hiprtcGetCode failed".into()));
        }
        buf
    };
    Ok(CompiledKernel {
        name: name.to_string(),
        arch: arch.to_string(),
        code: bytes,
    })
}

/// [`compile`] through `cache`: an entry for the same source, architecture, options and
/// hiprtc library is loaded instead of compiled.
pub fn compile_cached(
    cache: &crate::kernel_cache::KernelCache,
    name: &str,
    source: &str,
    arch: &str,
    options: &[&str],
) -> Result<CompiledKernel> {
    let compiler = format!("hiprtc {LIBRARY}");
    let options_text = options.join(" ");
    let (_, code) = cache.get_or_compile(
        &[
            &compiler,
            arch,
            &options_text,
            crate::launch_abi::LAUNCH_ABI,
            source,
        ],
        || compile(name, source, arch, options).map(|k| (String::new(), k.code)),
    )?;
    Ok(CompiledKernel {
        name: name.to_string(),
        arch: arch.to_string(),
        code,
    })
}
