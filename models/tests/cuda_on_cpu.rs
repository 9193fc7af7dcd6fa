//! Every fused kernel (pointwise and row groups) of every model, emitted as CUDA C, built for
//! the CPU by the host's C++ compiler under a small shim (`blockIdx`, `threadIdx` and the few
//! intrinsics the prelude uses) and run over its whole grid, one thread after another, then
//! compared with the CPU's scalar functions by the checks wgpu and CUDA share
//! (`kernel_checks/`). The emitted kernels need no shared memory and no barriers, so running
//! their threads in turn computes what the GPU computes; what this cannot check is the GPU's
//! own libm (`expf`, `erff`, within the checks' tolerance of glibc's) and the launch itself,
//! which `cuda_runtime.rs` runs on a real GPU. So CI checks the CUDA text's meaning, not only
//! that NVRTC compiles it. Without a C++ compiler each test says it was skipped, by name
//! (`RTX_REQUIRE_CXX=1`, as in CI, makes that a failure).

mod kernel_checks;

use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;

use kernel_checks::KernelDevice;
use rtx_backends::cpu::scalar::{HalfType, Rounding};
use rtx_core::ir::emit::Target;

/// What CUDA gives a kernel that a C++ compiler does not: the thread's coordinates and the
/// prelude's intrinsics (`__fmul_rn` and friends round each operation alone, which
/// `-ffp-contract=off` keeps true of the plain operators).
const SHIM: &str = r#"
#include <math.h>
#include <string.h>
struct rtx_dim3 { unsigned int x, y, z; };
static rtx_dim3 blockIdx, threadIdx, gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
"#;

/// Launch function signature: the kernel's parameters as pointers, grid x and y, block x.
type Launch = unsafe extern "C" fn(*const *mut c_void, u32, u32, u32);

/// The CUDA kernels' grid, run on this CPU.
struct CudaOnCpu {
    dir: PathBuf,
    compiler: String,
    launches: RefCell<HashMap<u64, (libloading::Library, Launch)>>,
}

fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    Command::new(&cxx)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| cxx)
}

fn device(test: &str) -> Option<CudaOnCpu> {
    match compiler() {
        Some(compiler) => {
            let dir = std::env::temp_dir().join(format!("rtx-cuda-on-cpu-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Some(CudaOnCpu {
                dir,
                compiler,
                launches: RefCell::new(HashMap::new()),
            })
        }
        None => {
            assert!(
                std::env::var("RTX_REQUIRE_CXX").as_deref() != Ok("1"),
                "{test}: RTX_REQUIRE_CXX=1 but no C++ compiler (`c++` or $CXX) runs"
            );
            eprintln!("skipped: {test}: no C++ compiler (`c++` or $CXX)");
            None
        }
    }
}

impl CudaOnCpu {
    /// `entry` of `source` built into a library with a launcher over the whole grid.
    fn launch(
        &self,
        name: &str,
        source: &str,
        entry: &str,
        params: usize,
    ) -> Result<Launch, String> {
        let mut h = DefaultHasher::new();
        (source, entry, params).hash(&mut h);
        let key = h.finish();
        if let Some((_, f)) = self.launches.borrow().get(&key) {
            return Ok(*f);
        }
        let args: Vec<String> = (0..params)
            .map(|p| match p {
                0 => "(const unsigned int*)a[0]".to_string(),
                p => format!("(float*)a[{p}]"),
            })
            .collect();
        let launcher = format!(
            "\nextern \"C\" void rtx_launch(void** a, unsigned int gx, unsigned int gy, unsigned int bx) {{\n\
             gridDim = {{gx, gy, 1}}; blockDim = {{bx, 1, 1}};\n\
             for (unsigned int y = 0; y < gy; ++y) for (unsigned int x = 0; x < gx; ++x) {{\n\
             blockIdx = {{x, y, 0}};\n\
             for (unsigned int t = 0; t < bx; ++t) {{ threadIdx = {{t, 0, 0}}; {entry}({}); }}\n\
             }}\n}}\n",
            args.join(", ")
        );
        let cpp = self.dir.join(format!("k{key:016x}.cpp"));
        let so = self.dir.join(format!("k{key:016x}.so"));
        std::fs::write(&cpp, format!("{SHIM}{source}{launcher}")).map_err(|e| e.to_string())?;
        let out = Command::new(&self.compiler)
            .args(["-O1", "-shared", "-fPIC", "-ffp-contract=off", "-w", "-o"])
            .arg(&so)
            .arg(&cpp)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{name}: the C++ compiler refused the CUDA text:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // SAFETY: the library is the one just built from the shim, the kernel and its
        // launcher; it runs no initializers of its own.
        let lib = unsafe { libloading::Library::new(&so) }.map_err(|e| e.to_string())?;
        // SAFETY: `rtx_launch` has the `Launch` signature, written above.
        let f: Launch = unsafe {
            *lib.get::<Launch>(b"rtx_launch\0")
                .map_err(|e| e.to_string())?
        };
        self.launches.borrow_mut().insert(key, (lib, f));
        Ok(f)
    }
}

impl KernelDevice for CudaOnCpu {
    type Buffer = Vec<f32>;
    const TARGET: Target = Target::Cuda;

    fn describe(&self) -> String {
        format!("the CPU ({} under a CUDA shim)", self.compiler)
    }

    fn upload(&self, values: &[f32]) -> Result<Vec<f32>, String> {
        Ok(values.to_vec())
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, String> {
        Ok(vec![0.0; len])
    }

    fn read(&self, buffer: &Vec<f32>) -> Result<Vec<f32>, String> {
        Ok(buffer.clone())
    }

    fn run(
        &self,
        name: &str,
        source: &str,
        entry: &str,
        meta: &[u32],
        inputs: &[&Vec<f32>],
        outputs: &mut [Vec<f32>],
        threads: usize,
        group: u32,
    ) -> Result<(), String> {
        let launch = self.launch(name, source, entry, 1 + inputs.len() + outputs.len())?;
        let mut params: Vec<*mut c_void> = vec![meta.as_ptr() as *mut c_void];
        params.extend(inputs.iter().map(|b| b.as_ptr() as *mut c_void));
        params.extend(outputs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
        let blocks = threads.div_ceil(group.max(1) as usize) as u32;
        // SAFETY: the kernel reads and writes the elements its meta words describe, which
        // `kernel_checks` sized every buffer for, as on a GPU.
        unsafe { launch(params.as_ptr(), blocks, 1, group) };
        Ok(())
    }
}

#[test]
fn every_fused_cuda_kernel_of_every_model_computes_the_cpus_values() {
    let test = "every_fused_cuda_kernel_of_every_model_computes_the_cpus_values";
    let Some(d) = device(test) else { return };
    kernel_checks::fused_kernels_match(&d, test, Rounding::NONE, false);
}

#[test]
fn every_rounding_cuda_kernel_rounds_to_bf16_and_f16_as_the_cpu_bit_for_bit() {
    let test = "every_rounding_cuda_kernel_rounds_to_bf16_and_f16_as_the_cpu_bit_for_bit";
    let Some(d) = device(test) else { return };
    for to in [HalfType::Bf16, HalfType::F16] {
        kernel_checks::fused_kernels_match(&d, test, Rounding::new(to, 1024.0), true);
    }
}

#[test]
fn every_function_of_the_cuda_prelude_computes_the_cpus_values() {
    let test = "every_function_of_the_cuda_prelude_computes_the_cpus_values";
    let Some(d) = device(test) else { return };
    kernel_checks::prelude_functions_match(&d);
}

#[test]
fn every_row_group_cuda_kernel_of_every_model_computes_the_cpus_values() {
    let test = "every_row_group_cuda_kernel_of_every_model_computes_the_cpus_values";
    let Some(d) = device(test) else { return };
    kernel_checks::row_kernels_match(&d, test);
}

#[test]
fn a_cuda_kernel_on_the_cpu_reads_a_transposed_input_through_its_strides() {
    let test = "a_cuda_kernel_on_the_cpu_reads_a_transposed_input_through_its_strides";
    let Some(d) = device(test) else { return };
    kernel_checks::transposed_input_is_read_through_its_strides(&d);
}
