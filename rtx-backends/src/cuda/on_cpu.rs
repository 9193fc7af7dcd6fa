//! CUDA kernels run on this CPU, for tests: the kernel's text is built by the host's C++
//! compiler under a small shim (`blockIdx`, `threadIdx`, `gridDim`, `blockDim` and the few
//! intrinsics the emitted prelude uses) into a shared library with a launcher that runs every
//! thread of the grid in turn.
//!
//! That computes what the GPU computes for kernels that use no shared memory, barriers or
//! warp operations, which is every emitted pointwise and row kernel and every kernel of
//! `kernels.rs`. A kernel that shares memory (`__shared__`, `__syncthreads`: the tiled GEMM
//! of `gemm_tiled.rs`) runs each block's threads side by side as host threads instead
//! (`THREADED_LAUNCH`); `launch` refuses warp operations (`__shfl`), which neither models.
//! It cannot check the GPU's own libm (`expf`, `erff` differ from glibc's by an ulp or two)
//! or the launch itself: the runtime's tests do that on a GPU. CI runs it so that the CUDA
//! text's meaning is checked on every commit, not only that NVRTC compiles it.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use super::{GpuError, Result};
use crate::launch_abi::{LAUNCH_ABI, LaunchMeta};

/// What CUDA gives a kernel that a C++ compiler does not. `__fmul_rn` and friends round each
/// operation alone, which `-ffp-contract=off` keeps true of the plain operators.
const SHIM: &str = r#"
#include <math.h>
#include <string.h>
#include <type_traits>
#include <utility>
struct rtx_dim3 { unsigned int x, y, z; };
static rtx_dim3 gridDim, blockDim;
#ifdef RTX_THREADED_BLOCKS
// A block's threads run side by side as host threads (see `THREADED_LAUNCH`): each knows its
// own indices, `__shared__` memory is one static per kernel (blocks run one after another),
// and `__syncthreads` waits for every thread of the block.
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
static thread_local rtx_dim3 blockIdx, threadIdx;
struct rtx_barrier {
    std::mutex lock;
    std::condition_variable turned;
    unsigned int count = 0, waiting = 0, generation = 0;
    void wait() {
        std::unique_lock<std::mutex> held(lock);
        const unsigned int mine = generation;
        if (++waiting == count) {
            waiting = 0;
            ++generation;
            turned.notify_all();
        } else {
            turned.wait(held, [&] { return generation != mine; });
        }
    }
};
static rtx_barrier rtx_block_barrier;
#define __syncthreads() rtx_block_barrier.wait()
#define __shared__ static
#else
static rtx_dim3 blockIdx, threadIdx;
#endif
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
// A pointer parameter is the pointer itself; a struct (the meta words) is read from it.
template <typename P> static P rtx_arg(void* p) {
    if constexpr (std::is_pointer<P>::value) return static_cast<P>(p);
    else return *static_cast<P*>(p);
}
template <typename... P, size_t... I>
static void rtx_apply(void (*k)(P...), void** a, std::index_sequence<I...>) {
    k(rtx_arg<P>(a[I])...);
}
template <typename... P>
static void rtx_invoke(void (*k)(P...), void** a) {
    rtx_apply(k, a, std::index_sequence_for<P...>{});
}
"#;

/// The launcher of a kernel that shares memory between threads: one host thread per thread
/// of a block, every one of them walking the grid's blocks in the same order and meeting at
/// the barrier after each, so a block's `__shared__` statics are never in use by two blocks.
/// The kernel must reach each `__syncthreads` in all threads of a block, as on a GPU.
const THREADED_LAUNCH: &str = r#"
extern "C" void rtx_launch(void** a, unsigned int gx, unsigned int gy, unsigned int gz,
                           unsigned int bx, unsigned int by, unsigned int bz) {
    gridDim = {gx, gy, gz};
    blockDim = {bx, by, bz};
    const unsigned int threads = bx * by * bz;
    rtx_block_barrier.count = threads;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned int t = 0; t < threads; ++t) {
        pool.emplace_back([=] {
            threadIdx = {t % bx, t / bx % by, t / (bx * by)};
            for (unsigned int z = 0; z < gz; ++z)
                for (unsigned int y = 0; y < gy; ++y)
                    for (unsigned int x = 0; x < gx; ++x) {
                        blockIdx = {x, y, z};
                        rtx_invoke({entry}, a);
                        rtx_block_barrier.wait();
                    }
        });
    }
    for (auto& thread : pool) thread.join();
}
"#;

/// The launcher's signature: the kernel's parameters as pointers (a by-value one as a pointer
/// to it), grid x, y, z, block x, y, z.
type Launch = unsafe extern "C" fn(*const *mut c_void, u32, u32, u32, u32, u32, u32);

/// A C++ compiler that builds CUDA kernels for this CPU, and the kernels it built.
pub struct CudaOnCpu {
    dir: PathBuf,
    compiler: String,
    launches: Mutex<HashMap<u64, (libloading::Library, Launch)>>,
}

impl CudaOnCpu {
    /// `$CXX`, else `c++`, if it runs; built libraries go to a fresh temporary folder.
    pub fn open() -> Result<CudaOnCpu> {
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let runs = Command::new(&compiler)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !runs {
            return Err(GpuError::MissingLibrary {
                library: "a C++ compiler (`c++` or $CXX)",
                help: "install g++ (Debian: `apt-get install -y g++`)",
            });
        }
        let dir = std::env::temp_dir().join(format!("rtx-cuda-on-cpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| GpuError::Call(e.to_string()))?;
        Ok(CudaOnCpu {
            dir,
            compiler,
            launches: Mutex::new(HashMap::new()),
        })
    }

    /// Which compiler builds the kernels.
    pub fn describe(&self) -> String {
        format!("the CPU ({} under a CUDA shim)", self.compiler)
    }

    /// Builds kernel `entry` of `source` (once per process) without running it.
    pub fn build(&self, name: &str, source: &str, entry: &str) -> Result<()> {
        self.launcher(name, source, entry).map(|_| ())
    }

    fn launcher(&self, name: &str, source: &str, entry: &str) -> Result<Launch> {
        let mut h = DefaultHasher::new();
        (source, entry).hash(&mut h);
        let key = h.finish();
        // Held while building, so that two threads asking for one kernel build it once.
        let mut launches = self
            .launches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, f)) = launches.get(&key) {
            return Ok(*f);
        }
        if source.contains("__shfl") || source.contains("warpSize") {
            return Err(GpuError::Call(format!(
                "`{name}` uses warp operations, which the CPU stand-in does not model"
            )));
        }
        let threaded = source.contains("__syncthreads") || source.contains("__shared__");
        let launcher = if threaded {
            THREADED_LAUNCH.replace("{entry}", entry)
        } else {
            format!(
                "\nextern \"C\" void rtx_launch(void** a, unsigned int gx, unsigned int gy, unsigned int gz,\n\
             unsigned int bx, unsigned int by, unsigned int bz) {{\n\
             gridDim = {{gx, gy, gz}}; blockDim = {{bx, by, bz}};\n\
             for (unsigned int z = 0; z < gz; ++z) for (unsigned int y = 0; y < gy; ++y)\n\
             for (unsigned int x = 0; x < gx; ++x) {{\n\
             blockIdx = {{x, y, z}};\n\
             for (unsigned int tz = 0; tz < bz; ++tz) for (unsigned int ty = 0; ty < by; ++ty)\n\
             for (unsigned int tx = 0; tx < bx; ++tx) {{\n\
             threadIdx = {{tx, ty, tz}};\n\
             rtx_invoke({entry}, a);\n\
             }}\n}}\n}}\n"
            )
        };
        let cpp = self.dir.join(format!("k{key:016x}.cpp"));
        let so = self.dir.join(format!("k{key:016x}.so"));
        let threads = if threaded {
            "#define RTX_THREADED_BLOCKS\n"
        } else {
            ""
        };
        std::fs::write(
            &cpp,
            format!("{threads}{SHIM}{LAUNCH_ABI}{source}\n{launcher}"),
        )
        .map_err(|e| GpuError::Call(e.to_string()))?;
        let out = Command::new(&self.compiler)
            .args([
                "-O1",
                "-std=c++17",
                "-pthread",
                "-shared",
                "-fPIC",
                "-ffp-contract=off",
                "-w",
                "-o",
            ])
            .arg(&so)
            .arg(&cpp)
            .output()
            .map_err(|e| GpuError::Call(e.to_string()))?;
        if !out.status.success() {
            return Err(GpuError::Compile {
                name: name.to_string(),
                message: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        // SAFETY: the library was just built from the shim, the kernel and its launcher; it
        // has no initializers of its own.
        let lib =
            unsafe { libloading::Library::new(&so) }.map_err(|e| GpuError::Call(e.to_string()))?;
        // SAFETY: `rtx_launch` has the `Launch` signature, written above.
        let f: Launch = unsafe {
            *lib.get::<Launch>(b"rtx_launch\0")
                .map_err(|e| GpuError::Call(e.to_string()))?
        };
        launches.insert(key, (lib, f));
        Ok(f)
    }

    /// Runs kernel `entry` of `source` over `grid` blocks of `block` threads, with `meta` as
    /// its meta words (passed as a GPU launch passes them: in the `RTX_META` parameter when
    /// they fit, else from a buffer) and then `buffers`, host pointers to what it reads and
    /// writes.
    ///
    /// # Safety
    /// `buffers` match the kernel's parameters after its meta words in number and pointee
    /// type, and every element the kernel reads or writes through them is inside its buffer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &self,
        name: &str,
        source: &str,
        entry: &str,
        meta: &[u32],
        buffers: &[*mut c_void],
        grid: [u32; 3],
        block: [u32; 3],
    ) -> Result<()> {
        let f = self.launcher(name, source, entry)?;
        // Past the inline words the kernel reads the caller's slice itself.
        let mut launch_meta =
            LaunchMeta::inline(meta).unwrap_or_else(|| LaunchMeta::spilled(meta.as_ptr() as u64));
        let mut params: Vec<*mut c_void> = vec![(&mut launch_meta as *mut LaunchMeta).cast()];
        params.extend_from_slice(buffers);
        // SAFETY: the caller's guarantees; the launcher passes each pointer to its parameter,
        // and the meta words' struct by value; `meta` outlives the run.
        unsafe {
            f(
                params.as_ptr(),
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
            )
        };
        Ok(())
    }
}
