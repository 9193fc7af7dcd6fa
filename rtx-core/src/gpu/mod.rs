//! Compiled graph functions on a GPU: when a graph method's inputs live on a device, the
//! generated code hands the call here, and the same fusion plan the CPU code was generated
//! from (`rtx_ir::fusion::plan`, through `rtx_ir::emit::passes`) runs as device kernels:
//! each pointwise and row group as the kernel `rtx_ir::emit` writes for it, the other core
//! ops as the backend's own kernels (GEMM, reductions, gathers) or as views.
//!
//! Without the `wgpu` and `cuda` features every tensor is on the CPU and the hooks below return `None`,
//! one branch per call.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod exec;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gemm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod nn;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod ops;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) use ops::{contiguous, download, gpu as storage};

/// `t` in a new contiguous buffer of its own on its device.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) fn copy(t: &Tensor) -> Result<Tensor> {
    ops::copy_to(t, t.shape())
}

use crate::ctx::Ctx;
use crate::error::{Result, RtxError};
use crate::module::{Grads, Module};
use crate::tensor::Tensor;
use rtx_ir::GraphFn;

/// The device of a call's inputs when it is not the CPU (`None`: run on the CPU). Inputs on
/// two different devices are an error naming both.
pub fn device_of(inputs: &[&Tensor]) -> Result<Option<crate::Device>> {
    let Some(first) = inputs.first() else {
        return Ok(None);
    };
    let device = first.device();
    for t in &inputs[1..] {
        let other = t.device();
        if other != device {
            return Err(RtxError::DeviceMismatch {
                context: "the inputs of a graph function".into(),
                expected: format!("every input on {device} (the first input's device)"),
                found: format!("one on {other}"),
            });
        }
    }
    Ok((!device.is_cpu()).then_some(device))
}

/// `f`'s forward pass on the inputs' device, or `None` when they are on the CPU.
#[doc(hidden)]
pub fn forward_on<M: Module>(
    module: &M,
    f: &'static GraphFn,
    ctx: &mut Ctx,
    inputs: &[&Tensor],
) -> Option<Result<Tensor>> {
    let device = match device_of(inputs) {
        Ok(Some(d)) => d,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        Some(exec::forward(&device, module, f, ctx, inputs))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (module, f, ctx, device);
        None
    }
}

/// `f`'s value and gradients on the inputs' device, or `None` when they are on the CPU.
#[doc(hidden)]
pub fn and_grads_on<M: Module>(
    module: &M,
    f: &'static GraphFn,
    ctx: &mut Ctx,
    inputs: &[&Tensor],
) -> Option<Result<(Tensor, Grads)>> {
    let device = match device_of(inputs) {
        Ok(Some(d)) => d,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        Some(exec::and_grads(&device, module, f, ctx, inputs))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (module, f, ctx, device);
        None
    }
}

/// An eager op (`ops::run_op`, after its shape rule) whose operands are on a device, run
/// there; `None` when they are on the CPU.
pub(crate) fn run_op_on(
    op: &rtx_ir::Op,
    args: &[&Tensor],
    out_shape: &[usize],
    ctx: &mut Ctx,
) -> Option<Result<Tensor>> {
    match device_of(args) {
        Ok(None) => None,
        Err(e) => Some(Err(e)),
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        Ok(Some(_)) => Some(ops::run(op, args, out_shape, ctx)),
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        Ok(Some(_)) => {
            let _ = (op, out_shape, ctx);
            None
        }
    }
}

/// How many core-op kernels ran on the CPU, by op name, because the device has no kernel
/// for them yet (their inputs are copied to the host and the result back).
pub fn cpu_fallbacks() -> Vec<(String, usize)> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        ops::fallbacks()
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        Vec::new()
    }
}
