//! Compiled models on a CUDA GPU: the checks of `device_training/` (the same `forward` and
//! `loss_and_grads` methods, called with tensors on the device, against the CPU on fresh
//! random inputs; AdamW steps, clipping, the GPT's training steps and checkpoint; the digits
//! MLP trained to 0.97). Without a GPU (or its driver and cuBLAS) each test prints that it
//! was skipped; `RTX_REQUIRE_CUDA=1` makes that a failure (the lent-GPU check sets it).
//! `on_cpu` runs them all again on the CUDA backend with the CPU standing in for the GPU;
//! `hip_on_cpu` runs the MLP's and the GPT's gradients with the tiled GEMM of a HIP device.
#![cfg(feature = "cuda")]

mod device_training;

use rtx_core::prelude::*;

fn device(test: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("RTX_REQUIRE_CUDA").as_deref() != Ok("1") => {
            eprintln!("skipped: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: RTX_REQUIRE_CUDA=1 but {e}"),
    }
}

device_training_tests!(device);

/// The same checks on `Device::cuda_on_cpu()`: the CUDA backend with its kernels built by
/// the host's `c++` and run thread by thread, and the CPU's GEMM standing in for cuBLAS, so
/// rtx-core's CUDA path (the CUDA C of every fused group and core op, cuBLAS's strided
/// operands, the epilogue after the product) runs on machines without a GPU. Skipped
/// without a C++ compiler (`RTX_REQUIRE_CXX=1` makes that a failure; CI sets it).
mod on_cpu {
    use crate::{device_training, device_training_tests};
    use rtx_core::prelude::*;

    fn device(test: &str) -> Option<Device> {
        match Device::cuda_on_cpu() {
            Ok(d) => Some(d),
            Err(e) if std::env::var("RTX_REQUIRE_CXX").as_deref() != Ok("1") => {
                eprintln!("skipped: {test}: {e}");
                None
            }
            Err(e) => panic!("{test}: RTX_REQUIRE_CXX=1 but {e}"),
        }
    }

    device_training_tests!(device);
}

/// The model checks that run products on `Device::hip_on_cpu()`: the CPU stand-in launching
/// what a HIP device launches, the tiled GEMM kernel included, so `Device::hip`'s products
/// are checked against the CPU on machines without an AMD GPU.
mod hip_on_cpu {
    use crate::device_training;
    use rtx_core::prelude::*;

    fn device(test: &str) -> Option<Device> {
        match Device::hip_on_cpu() {
            Ok(d) => Some(d),
            Err(e) if std::env::var("RTX_REQUIRE_CXX").as_deref() != Ok("1") => {
                eprintln!("skipped: {test}: {e}");
                None
            }
            Err(e) => panic!("{test}: RTX_REQUIRE_CXX=1 but {e}"),
        }
    }

    #[test]
    fn the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on() {
        if let Some(d) =
            device("hip_on_cpu::the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on")
        {
            device_training::the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on(&d);
        }
    }

    #[test]
    fn the_gpt_loss_and_gradients_match_the_cpu() {
        if let Some(d) = device("hip_on_cpu::the_gpt_loss_and_gradients_match_the_cpu") {
            device_training::the_gpt_loss_and_gradients_match_the_cpu(&d);
        }
    }
}
