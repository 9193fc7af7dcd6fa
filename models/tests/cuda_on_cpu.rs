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
        let mut params: Vec<*mut c_void> = vec![meta.as_ptr() as *mut c_void];
        params.extend(inputs.iter().map(|b| b.as_ptr() as *mut c_void));
        params.extend(outputs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
        let blocks = threads.div_ceil(group.max(1) as usize) as u32;
        // SAFETY: an emitted kernel takes the meta words, then one pointer per input and per
        // output, and touches only the elements its meta words describe, which
        // `kernel_checks` sized every buffer for, as on a GPU.
        unsafe { self.launch(name, source, entry, &params, [blocks, 1, 1], [group, 1, 1]) }
            .map_err(|e| e.to_string())?;
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
