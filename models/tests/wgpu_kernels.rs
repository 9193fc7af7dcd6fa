//! Every fused kernel (pointwise and row groups) of every model, emitted as WGSL, run on the
//! wgpu adapter (llvmpipe in CI) on fresh random inputs and compared with the CPU's scalar
//! functions element by element (the checks are in `kernel_checks/`, shared with CUDA).
//! Needs `--features wgpu`; without an adapter each test says it was skipped, by name
//! (`RTX_REQUIRE_WGPU=1`, as in CI, makes that a failure).
#![cfg(feature = "wgpu")]

#[macro_use]
mod kernel_checks;

use kernel_checks::KernelDevice;
use rtx_backends::cpu::scalar::{HalfType, Rounding};
use rtx_backends::wgpu::{GpuBuffer, Kernel, WgpuDevice};
use rtx_core::ir::emit::Target;

fn device(test: &str) -> Option<WgpuDevice> {
    match WgpuDevice::open() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("RTX_REQUIRE_WGPU").as_deref() != Ok("1") => {
            eprintln!("skipped: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_WGPU=1 but {e}"),
    }
}

impl KernelDevice for WgpuDevice {
    type Buffer = GpuBuffer;
    const TARGET: Target = Target::Wgsl;

    fn describe(&self) -> String {
        WgpuDevice::describe(self)
    }

    fn upload(&self, values: &[f32]) -> Result<GpuBuffer, String> {
        self.upload_f32(values).map_err(|e| e.to_string())
    }

    fn zeros(&self, len: usize) -> Result<GpuBuffer, String> {
        WgpuDevice::zeros(self, len).map_err(|e| e.to_string())
    }

    fn read(&self, buffer: &GpuBuffer) -> Result<Vec<f32>, String> {
        self.read_f32(buffer).map_err(|e| e.to_string())
    }

    fn run(
        &self,
        name: &str,
        source: &str,
        entry: &str,
        meta: &[u32],
        inputs: &[&GpuBuffer],
        outputs: &mut [GpuBuffer],
        threads: usize,
        group: u32,
    ) -> Result<(), String> {
        let kernel = Kernel {
            name,
            source,
            entry,
        };
        let outputs: Vec<&GpuBuffer> = outputs.iter().collect();
        self.run_pointwise(&kernel, meta, inputs, &outputs, threads, group)
            .map_err(|e| e.to_string())
    }
}

kernel_check_tests!(device);
