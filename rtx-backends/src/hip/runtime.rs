//! The HIP runtime: one AMD GPU through ROCm's `libamdhip64.so.5` (the library hiprtc lives
//! in), driving the same CUDA C kernels as the CUDA runtime, compiled by hiprtc. It is a
//! [`CudaDevice`](crate::cuda::CudaDevice) whose runner is this driver
//! (`CudaDevice::open_hip`), so every kernel, its meta words and rtx-core's executor are the
//! CUDA path's, which CI runs on the CPU stand-in.
//!
//! - One stream; host reads and uploads synchronize it (an upload copies from pageable
//!   memory, which HIP copies synchronously anyway).
//! - Device memory comes from a caching pool of our own ([`HipPool`]): freed buffers are kept
//!   by size class and reused, so a training step after the first allocates nothing from the
//!   driver. ROCm 5.2's stream-ordered allocator is not relied on.
//! - Products run the tiled GEMM of `cuda/gemm_tiled.rs`: hipBLAS is not among the ROCm
//!   libraries Debian ships next to hiprtc.
//!
//! No maintained crate binds the HIP runtime without linking ROCm at build time, so the
//! functions called are declared here (`Api`), with the signatures of ROCm 5.2's
//! `hip_runtime_api.h`.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use crate::gpu_error::{GpuError, Result};
use crate::kernel_cache::KernelCache;
use crate::launch_abi::LaunchMeta;

type HipError = c_int;
type Stream = *mut c_void;
type Module = *mut c_void;
type Function = *mut c_void;
type Event = *mut c_void;

const SUCCESS: HipError = 0;
const OUT_OF_MEMORY: HipError = 2;
const HOST_TO_DEVICE: c_int = 1;
const DEVICE_TO_HOST: c_int = 2;
const DEVICE_TO_DEVICE: c_int = 3;

/// The HIP runtime functions this backend calls.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> HipError,
    device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> HipError,
    memset_async: unsafe extern "C" fn(*mut c_void, c_int, usize, Stream) -> HipError,
    stream_create: unsafe extern "C" fn(*mut Stream) -> HipError,
    stream_synchronize: unsafe extern "C" fn(Stream) -> HipError,
    module_load_data: unsafe extern "C" fn(*mut Module, *const c_void) -> HipError,
    module_get_function: unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        Function,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Stream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    event_create: unsafe extern "C" fn(*mut Event) -> HipError,
    event_record: unsafe extern "C" fn(Event, Stream) -> HipError,
    event_synchronize: unsafe extern "C" fn(Event) -> HipError,
    event_elapsed: unsafe extern "C" fn(*mut f32, Event, Event) -> HipError,
    event_destroy: unsafe extern "C" fn(Event) -> HipError,
    error_name: unsafe extern "C" fn(HipError) -> *const c_char,
}

/// The functions of `libamdhip64`, resolved once per process.
fn api() -> Result<&'static Api> {
    static API: std::sync::OnceLock<std::result::Result<Api, String>> = std::sync::OnceLock::new();
    let api = API.get_or_init(|| {
        let lib = super::library().ok_or_else(|| "libamdhip64.so.5 not found".to_string())?;
        // SAFETY: each symbol is declared with its signature in ROCm 5.2's headers; the
        // library stays loaded for the whole process (`library` keeps it in a static).
        unsafe {
            macro_rules! f {
                ($name:literal) => {
                    *lib.get($name)
                        .map_err(|e| format!("symbol {} missing: {e}", stringify!($name)))?
                };
            }
            Ok(Api {
                init: f!(b"hipInit"),
                device_count: f!(b"hipGetDeviceCount"),
                set_device: f!(b"hipSetDevice"),
                device_name: f!(b"hipDeviceGetName"),
                properties: f!(b"hipGetDeviceProperties"),
                malloc: f!(b"hipMalloc"),
                free: f!(b"hipFree"),
                memcpy_async: f!(b"hipMemcpyAsync"),
                memset_async: f!(b"hipMemsetAsync"),
                stream_create: f!(b"hipStreamCreate"),
                stream_synchronize: f!(b"hipStreamSynchronize"),
                module_load_data: f!(b"hipModuleLoadData"),
                module_get_function: f!(b"hipModuleGetFunction"),
                launch: f!(b"hipModuleLaunchKernel"),
                event_create: f!(b"hipEventCreate"),
                event_record: f!(b"hipEventRecord"),
                event_synchronize: f!(b"hipEventSynchronize"),
                event_elapsed: f!(b"hipEventElapsedTime"),
                event_destroy: f!(b"hipEventDestroy"),
                error_name: f!(b"hipGetErrorName"),
            })
        }
    });
    api.as_ref().map_err(|e| {
        if super::library().is_none() {
            GpuError::MissingLibrary {
                library: "libamdhip64.so.5 (the HIP runtime)",
                help: super::HELP,
            }
        } else {
            GpuError::Call(e.clone())
        }
    })
}

impl Api {
    /// `status` as a `Result`, naming `what` was called and HIP's name for the error.
    fn check(&self, status: HipError, what: &str) -> Result<()> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: hipGetErrorName returns a static C string for every status.
        let name = unsafe { CStr::from_ptr((self.error_name)(status)) };
        Err(GpuError::Call(format!(
            "{what}: {} ({status})",
            name.to_string_lossy()
        )))
    }
}

/// Whether the HIP runtime loads and sees at least one AMD GPU.
pub fn hip_available() -> bool {
    let Ok(api) = api() else { return false };
    let mut count = 0;
    // SAFETY: plain calls with a valid out pointer.
    unsafe { (api.init)(0) };
    unsafe { (api.device_count)(&mut count) == SUCCESS && count > 0 }
}

/// Device memory kept for reuse, by size class.
pub(crate) struct HipPool {
    api: &'static Api,
    free: Mutex<HashMap<usize, Vec<usize>>>,
}

/// The bytes a request of `bytes` is served from: a quarter step between powers of two
/// (at most 25% unused), at least 256 bytes.
fn size_class(bytes: usize) -> usize {
    let bytes = bytes.max(256);
    let power = bytes.next_power_of_two();
    let quarter = power / 8;
    bytes.div_ceil(quarter) * quarter
}

impl HipPool {
    /// `bytes` of device memory, reused from a freed buffer of its class when there is one.
    /// When the driver has none left, the pool's own cache is freed and the allocation tried
    /// once more before it is `OutOfMemory`.
    fn take(self: &Arc<Self>, bytes: usize) -> Result<HipSlice> {
        let class = size_class(bytes);
        let cached = self
            .free
            .lock()
            .ok()
            .and_then(|mut f| f.get_mut(&class).and_then(Vec::pop));
        let ptr = match cached {
            Some(ptr) => ptr,
            None => match self.allocate(class) {
                Err(GpuError::OutOfMemory { .. }) => {
                    self.release_cached();
                    self.allocate(class)?
                }
                other => other?,
            },
        };
        Ok(HipSlice {
            ptr,
            class,
            pool: Arc::clone(self),
        })
    }

    fn allocate(&self, class: usize) -> Result<usize> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out pointer.
        let status = unsafe { (self.api.malloc)(&mut ptr, class) };
        if status == OUT_OF_MEMORY {
            return Err(GpuError::OutOfMemory {
                requested: class as u64,
            });
        }
        self.api.check(status, "hipMalloc")?;
        Ok(ptr as usize)
    }

    fn release_cached(&self) {
        let Ok(mut free) = self.free.lock() else {
            return;
        };
        for ptr in free.drain().flat_map(|(_, ptrs)| ptrs) {
            // SAFETY: each pointer came from hipMalloc and no buffer holds it any more.
            unsafe { (self.api.free)(ptr as *mut c_void) };
        }
    }
}

impl Drop for HipPool {
    fn drop(&mut self) {
        self.release_cached();
    }
}

/// Device memory of one buffer; back to its pool on drop. Work queued on the one stream
/// before the drop finishes before any later work can reuse it, so no wait is needed.
pub(crate) struct HipSlice {
    ptr: usize,
    class: usize,
    pool: Arc<HipPool>,
}

impl HipSlice {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for HipSlice {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.free.lock() {
            free.entry(self.class).or_default().push(self.ptr);
        }
    }
}

/// One AMD GPU: its stream, memory pool and loaded kernels.
pub(crate) struct HipDriver {
    api: &'static Api,
    stream: Stream,
    pool: Arc<HipPool>,
    cache: KernelCache,
    functions: Mutex<HashMap<u64, (Module, Function)>>,
}

// SAFETY: the stream, modules and functions are handles the HIP runtime lets any thread use;
// the maps holding them are behind locks.
unsafe impl Send for HipDriver {}
unsafe impl Sync for HipDriver {}

/// What `open` learns of the device besides the driver: its name and architecture.
pub(crate) struct Opened {
    pub driver: HipDriver,
    pub name: String,
    pub arch: String,
}

impl HipDriver {
    /// AMD GPU `ordinal`, with a stream of its own. `RTX_HIP_ARCH` overrides the
    /// architecture kernels are compiled for (read from the device otherwise).
    pub(crate) fn open(ordinal: usize) -> Result<Opened> {
        let api = api()?;
        // SAFETY: plain calls with valid out pointers and buffers of the lengths given.
        unsafe {
            let init = (api.init)(0);
            let mut count = 0;
            let counted = (api.device_count)(&mut count);
            if counted != SUCCESS || count <= 0 {
                let cause = if counted != SUCCESS { counted } else { init };
                return Err(api
                    .check(cause, "no AMD GPU: hipGetDeviceCount")
                    .err()
                    .unwrap_or_else(|| GpuError::Call("no AMD GPU present".into())));
            }
            if ordinal >= count as usize {
                return Err(GpuError::Call(format!(
                    "HIP device {ordinal} requested, {count} present"
                )));
            }
            let device = ordinal as c_int;
            api.check((api.set_device)(device), "hipSetDevice")?;
            let mut name = [0 as c_char; 256];
            api.check(
                (api.device_name)(name.as_mut_ptr(), name.len() as c_int, device),
                "hipDeviceGetName",
            )?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let arch = match std::env::var("RTX_HIP_ARCH") {
                Ok(arch) if !arch.is_empty() => arch,
                _ => device_arch(api, device)?,
            };
            let mut stream: Stream = std::ptr::null_mut();
            api.check((api.stream_create)(&mut stream), "hipStreamCreate")?;
            let pool = Arc::new(HipPool {
                api,
                free: Mutex::new(HashMap::new()),
            });
            Ok(Opened {
                driver: HipDriver {
                    api,
                    stream,
                    pool,
                    cache: KernelCache::default_location(),
                    functions: Mutex::new(HashMap::new()),
                },
                name,
                arch,
            })
        }
    }

    /// A buffer of `words` 32-bit words (contents unspecified).
    pub(crate) fn alloc(&self, words: usize) -> Result<HipSlice> {
        let bytes = words.checked_mul(4).ok_or(GpuError::OutOfMemory {
            requested: u64::MAX,
        })?;
        self.pool.take(bytes)
    }

    pub(crate) fn upload(&self, words: &[u32]) -> Result<HipSlice> {
        let slice = self.alloc(words.len())?;
        // SAFETY: the slice holds at least `words.len()` words; the copy completes before
        // `words` can go away (the stream is synchronized).
        unsafe {
            self.api.check(
                (self.api.memcpy_async)(
                    slice.ptr as *mut c_void,
                    words.as_ptr().cast(),
                    std::mem::size_of_val(words),
                    HOST_TO_DEVICE,
                    self.stream,
                ),
                "hipMemcpyAsync (to the device)",
            )?;
        }
        self.synchronize()?;
        Ok(slice)
    }

    pub(crate) fn zeros(&self, words: usize) -> Result<HipSlice> {
        let slice = self.alloc(words)?;
        // SAFETY: the slice holds `words` words.
        let status =
            unsafe { (self.api.memset_async)(slice.ptr as *mut c_void, 0, words * 4, self.stream) };
        self.api.check(status, "hipMemsetAsync")?;
        Ok(slice)
    }

    /// The first `words` words of `slice`, once the stream's earlier work is done.
    pub(crate) fn read(&self, slice: &HipSlice, words: usize) -> Result<Vec<u32>> {
        let mut out = vec![0u32; words];
        // SAFETY: `out` holds `words` words and the slice at least as many.
        unsafe {
            self.api.check(
                (self.api.memcpy_async)(
                    out.as_mut_ptr().cast(),
                    slice.ptr as *const c_void,
                    words * 4,
                    DEVICE_TO_HOST,
                    self.stream,
                ),
                "hipMemcpyAsync (to the host)",
            )?;
        }
        self.synchronize()?;
        Ok(out)
    }

    pub(crate) fn copy(&self, src: &HipSlice, dst: &HipSlice, words: usize) -> Result<()> {
        // SAFETY: both slices hold at least `words` words (the caller checked the lengths).
        let status = unsafe {
            (self.api.memcpy_async)(
                dst.ptr as *mut c_void,
                src.ptr as *const c_void,
                words * 4,
                DEVICE_TO_DEVICE,
                self.stream,
            )
        };
        self.api.check(status, "hipMemcpyAsync (on the device)")
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is this driver's own.
        let status = unsafe { (self.api.stream_synchronize)(self.stream) };
        self.api.check(status, "hipStreamSynchronize")
    }

    /// `entry` of `source` compiled for `arch` (or found in the disk cache) and loaded, once
    /// per process.
    fn function(&self, name: &str, source: &str, entry: &str, arch: &str) -> Result<Function> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (source, entry).hash(&mut h);
        let key = h.finish();
        let mut functions = self
            .functions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(&(_, f)) = functions.get(&key) {
            return Ok(f);
        }
        let compiled = super::compile_cached(&self.cache, name, source, arch, &[])?;
        let entry_c = CString::new(entry).map_err(|_| GpuError::Compile {
            name: name.to_string(),
            message: "entry name holds a NUL byte".into(),
        })?;
        let load_error = |what: &str, e: GpuError| GpuError::Compile {
            name: name.to_string(),
            message: format!("{what}: {e}"),
        };
        let mut module: Module = std::ptr::null_mut();
        let mut function: Function = std::ptr::null_mut();
        // SAFETY: the code object is the ELF hiprtc produced; the module is kept loaded for
        // the process (in `functions`), so the function handle stays valid.
        unsafe {
            self.api
                .check(
                    (self.api.module_load_data)(&mut module, compiled.code.as_ptr().cast()),
                    "hipModuleLoadData",
                )
                .map_err(|e| load_error("loading", e))?;
            self.api
                .check(
                    (self.api.module_get_function)(&mut function, module, entry_c.as_ptr()),
                    "hipModuleGetFunction",
                )
                .map_err(|e| load_error(&format!("no entry `{entry}`"), e))?;
        }
        functions.insert(key, (module, function));
        Ok(function)
    }

    pub(crate) fn load(&self, name: &str, source: &str, entry: &str, arch: &str) -> Result<()> {
        self.function(name, source, entry, arch).map(|_| ())
    }

    /// Runs `entry` over `grid` blocks of `block` threads with `meta` in its `RTX_META`
    /// parameter (spilled to a buffer past the inline words) and then `pointers`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &self,
        (name, source, entry): (&str, &str, &str),
        arch: &str,
        meta: &[u32],
        pointers: &[u64],
        grid: [u32; 2],
        block: u32,
    ) -> Result<()> {
        let f = self.function(name, source, entry, arch)?;
        let spill;
        let mut launch_meta = match LaunchMeta::inline(meta) {
            Some(inline) => inline,
            None => {
                spill = self.upload(meta)?;
                LaunchMeta::spilled(spill.ptr())
            }
        };
        let mut pointers = pointers.to_vec();
        let mut params: Vec<*mut c_void> = vec![(&mut launch_meta as *mut LaunchMeta).cast()];
        params.extend(
            pointers
                .iter_mut()
                .map(|p| (p as *mut u64).cast::<c_void>()),
        );
        // SAFETY: the kernel's parameters are `RTX_META` (the struct `LaunchMeta` is) and one
        // device pointer per buffer, as the caller sized them; `params` points at values
        // alive until the call returns (HIP copies them at launch).
        let status = unsafe {
            (self.api.launch)(
                f,
                grid[0],
                grid[1],
                1,
                block,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.api.check(status, &format!("`{name}`"))
    }

    /// Milliseconds the stream spends on `f`'s work, between two events.
    pub(crate) fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let api = self.api;
        let (mut start, mut end): (Event, Event) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out pointers; the events are recorded on this driver's stream and
        // destroyed once, below.
        unsafe {
            api.check((api.event_create)(&mut start), "hipEventCreate")?;
            api.check((api.event_create)(&mut end), "hipEventCreate")?;
            let timed = (|| {
                api.check((api.event_record)(start, self.stream), "hipEventRecord")?;
                f()?;
                api.check((api.event_record)(end, self.stream), "hipEventRecord")?;
                api.check((api.event_synchronize)(end), "hipEventSynchronize")?;
                let mut ms = 0f32;
                api.check(
                    (api.event_elapsed)(&mut ms, start, end),
                    "hipEventElapsedTime",
                )?;
                Ok(ms)
            })();
            (api.event_destroy)(start);
            (api.event_destroy)(end);
            timed
        }
    }
}

/// The device's architecture for hiprtc (`gfx90a`), from `gcnArchName` in its properties
/// (`gfx90a:sramecc+:xnack-`). The properties struct's layout changed between ROCm releases,
/// so it is read into a buffer larger than any of them and the name found by its prefix.
fn device_arch(api: &Api, device: c_int) -> Result<String> {
    let mut props = vec![0u8; 16 << 10];
    // SAFETY: the buffer is larger than hipDeviceProp_t of every ROCm release.
    api.check(
        unsafe { (api.properties)(props.as_mut_ptr().cast(), device) },
        "hipGetDeviceProperties",
    )?;
    arch_in(&props).ok_or_else(|| {
        GpuError::Call(
            "no gfx architecture in the device's properties; set RTX_HIP_ARCH (e.g. gfx90a)".into(),
        )
    })
}

/// The first `gfx...` name in `bytes` (letters and digits after the prefix, up to a `:`
/// or NUL).
fn arch_in(bytes: &[u8]) -> Option<String> {
    let start = bytes.windows(3).position(|w| w == b"gfx")?;
    let name: String = bytes[start..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric())
        .map(|&b| b as char)
        .collect();
    (name.len() > 3).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::{arch_in, size_class};

    #[test]
    fn size_classes_waste_at_most_a_quarter_and_start_at_256_bytes() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1000), 1024);
        assert_eq!(size_class(1025), 1280);
        for bytes in [300, 5000, 123_456, 10_000_000] {
            let class = size_class(bytes);
            assert!(
                class >= bytes && (class - bytes) * 4 <= bytes,
                "{bytes} -> {class}"
            );
        }
    }

    #[test]
    fn the_architecture_is_read_from_gcn_arch_name_without_its_features() {
        let mut props = vec![0u8; 64];
        props[..14].copy_from_slice(b"AMD Instinct M");
        props[20..42].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(arch_in(&props).as_deref(), Some("gfx90a"));
        assert_eq!(arch_in(b"no architecture here"), None);
    }
}
