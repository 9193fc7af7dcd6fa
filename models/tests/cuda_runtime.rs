//! Every fused kernel (pointwise and row groups) of every model, emitted as CUDA C, compiled
//! for the GPU's own architecture, loaded and run on it on fresh random inputs, and compared
//! with the CPU's scalar functions element by element (the checks of `kernel_checks/`, the
//! same as on wgpu). Needs `--features cuda`, a GPU, libcuda, libnvrtc and libcublas; without
//! them each test says it was skipped, by name (`RTX_REQUIRE_CUDA=1`, as in
//! `scripts/gpu_check.sh`, makes that a failure).
#![cfg(feature = "cuda")]

#[macro_use]
mod kernel_checks;

use kernel_checks::KernelDevice;
use rtx_backends::cpu::scalar::{HalfType, Rounding};
use rtx_backends::cuda::{CudaBuffer, CudaDevice, CudaKernel};
use rtx_core::ir::emit::Target;

fn device(test: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("RTX_REQUIRE_CUDA").as_deref() != Ok("1") => {
            eprintln!("skipped: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_CUDA=1 but {e}"),
    }
}

impl KernelDevice for CudaDevice {
    type Buffer = CudaBuffer;
    const TARGET: Target = Target::Cuda;

    fn describe(&self) -> String {
        CudaDevice::describe(self)
    }

    fn upload(&self, values: &[f32]) -> Result<CudaBuffer, String> {
        CudaDevice::upload_f32(self, values).map_err(|e| e.to_string())
    }

    fn zeros(&self, len: usize) -> Result<CudaBuffer, String> {
        CudaDevice::zeros(self, len).map_err(|e| e.to_string())
    }

    fn read(&self, buffer: &CudaBuffer) -> Result<Vec<f32>, String> {
        CudaDevice::read_f32(self, buffer).map_err(|e| e.to_string())
    }

    fn run(
        &self,
        name: &str,
        source: &str,
        entry: &str,
        meta: &[u32],
        inputs: &[&CudaBuffer],
        outputs: &mut [CudaBuffer],
        threads: usize,
        group: u32,
    ) -> Result<(), String> {
        let kernel = CudaKernel {
            name,
            source,
            entry,
        };
        let outputs: Vec<&CudaBuffer> = outputs.iter().collect();
        self.run_emitted(&kernel, meta, inputs, &outputs, threads, group)
            .map_err(|e| e.to_string())
    }
}

kernel_check_tests!(device);
