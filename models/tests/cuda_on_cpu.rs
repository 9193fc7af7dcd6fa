//! Every fused kernel (pointwise and row groups) of every model, emitted as CUDA C, built for
//! the CPU by the host's C++ compiler under a small shim (`blockIdx`, `threadIdx` and the few
//! intrinsics the prelude uses) and run over its whole grid, one thread after another, then
//! compared with the CPU's scalar functions by the checks wgpu and CUDA share
//! (`kernel_checks/`). The emitted kernels need no shared memory and no barriers, so running
//! their threads in turn computes what the GPU computes; what this cannot check is the GPU's
//! own libm (`expf`, `erff`, within the checks' tolerance of glibc's) and the launch itself,
//! which `cuda_runtime.rs` runs on a real GPU. So CI checks the CUDA text's meaning, not only
//! that NVRTC compiles it (`rtx_backends::cuda::on_cpu`; needs `--features cuda`). Without a
//! C++ compiler each test says it was skipped, by name (`RTX_REQUIRE_CXX=1`, as in CI, makes
//! that a failure).

#![cfg(feature = "cuda")]

#[macro_use]
mod kernel_checks;

use std::ffi::c_void;

use kernel_checks::KernelDevice;
use rtx_backends::cpu::scalar::{HalfType, Rounding};
use rtx_backends::cuda::on_cpu::CudaOnCpu;
use rtx_core::ir::emit::Target;

fn device(test: &str) -> Option<CudaOnCpu> {
    match CudaOnCpu::open() {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(
                std::env::var("RTX_REQUIRE_CXX").as_deref() != Ok("1"),
                "{test}: RTX_REQUIRE_CXX=1 but {e}"
            );
            eprintln!("skipped: {test}: {e}");
            None
        }
    }
}

impl KernelDevice for CudaOnCpu {
    type Buffer = Vec<f32>;
    const TARGET: Target = Target::Cuda;

    fn describe(&self) -> String {
        CudaOnCpu::describe(self)
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
        let mut params: Vec<*mut c_void> =
            inputs.iter().map(|b| b.as_ptr() as *mut c_void).collect();
        params.extend(outputs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
        let blocks = threads.div_ceil(group.max(1) as usize) as u32;
        // SAFETY: an emitted kernel takes its meta words, then one pointer per input and per
        // output, and touches only the elements its meta words describe, which
        // `kernel_checks` sized every buffer for, as on a GPU.
        unsafe {
            self.launch(
                name,
                source,
                entry,
                meta,
                &params,
                [blocks, 1, 1],
                [group, 1, 1],
            )
        }
        .map_err(|e| e.to_string())?;
        Ok(())
    }
}

kernel_check_tests!(device);
