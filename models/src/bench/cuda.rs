//! GPU benchmarks on the CUDA runtime (cargo feature `cuda`): cuBLAS products at f32 and bf16,
//! and the elementwise chain of `BenchKernels::chain` as the one kernel the compiler emits for
//! it, next to a device-to-device copy of as many floats in the same run (the memory-bound
//! reference). `scripts/bench_gpu_peers.py` sets them beside `torch.matmul`, PyTorch's eager
//! chain and `torch.compile`'s on the same card.
//!
//! Times come from CUDA events around `REPS` back-to-back launches (the stream's time, not the
//! host's), after warm-up; the median and minimum per launch over the timed rounds are
//! reported. Without a GPU each group prints `# skipped: <name>: <reason>` and nothing else.

use rtx_backends::cpu::scalar::Rounding;
use rtx_backends::cuda::{CudaBuffer, CudaDevice, CudaKernel, GemmShape};
use rtx_core::ir::emit::{KernelSource, Meta, POINTWISE_GROUP, Target, model_kernels};
use rtx_core::prelude::*;

use super::{Line, Timing};
use crate::bench_models::BenchKernels;

/// Launches per timed round (events around them), and rounds.
const REPS: usize = 10;
const ROUNDS: usize = 15;
const WARMUP_ROUNDS: usize = 3;

fn gpu(e: rtx_backends::gpu_error::GpuError) -> RtxError {
    RtxError::Gpu(e.to_string())
}

fn open(name: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => {
            println!("# {name}: {}", d.describe());
            Some(d)
        }
        Err(e) => {
            println!("# skipped: {name}: {e}");
            None
        }
    }
}

/// Per-launch stream times of `launch` in microseconds: `ROUNDS` rounds of `REPS` launches.
fn measure_gpu(
    d: &CudaDevice,
    mut launch: impl FnMut() -> rtx_backends::cuda::Result<()>,
) -> Result<Timing> {
    for _ in 0..WARMUP_ROUNDS * REPS {
        launch().map_err(gpu)?;
    }
    let mut samples_us = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let ms = d
            .time_ms(|| {
                for _ in 0..REPS {
                    launch()?;
                }
                Ok(())
            })
            .map_err(gpu)?;
        samples_us.push(ms as f64 * 1e3 / REPS as f64);
    }
    Ok(Timing { samples_us })
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// Square products through cuBLAS: f32 (`cublasSgemm`, full f32, no TF32) and bf16 operands
/// and result with f32 accumulation on the tensor cores (`cublasGemmEx`).
pub(super) fn cuda_gemm() -> Result<()> {
    let Some(d) = open("cuda_gemm") else {
        return Ok(());
    };
    for n in [1024usize, 2048, 4096, 8192] {
        let (a, b) = (random(n * n, 1), random(n * n, 2));
        let flops = 2.0 * (n as f64).powi(3);
        let shape = GemmShape::plain(n, n, n);
        let (ba, bb) = (d.upload(&a).map_err(gpu)?, d.upload(&b).map_err(gpu)?);
        let mut c: CudaBuffer<f32> = d.zeros(n * n).map_err(gpu)?;
        let t = measure_gpu(&d, || d.gemm_f32(shape, &ba, &bb, &mut c))?;
        print_gemm("f32", n, flops, &t);
        drop((ba, bb, c));
        let bits = |v: &[f32]| -> Vec<u16> {
            v.iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect()
        };
        let (ha, hb) = (
            d.upload(&bits(&a)).map_err(gpu)?,
            d.upload(&bits(&b)).map_err(gpu)?,
        );
        let mut hc: CudaBuffer<u16> = d.zeros(n * n).map_err(gpu)?;
        let t = measure_gpu(&d, || d.gemm_bf16(shape, &ha, &hb, &mut hc))?;
        print_gemm("bf16", n, flops, &t);
    }
    Ok(())
}

fn print_gemm(dtype: &str, n: usize, flops: f64, t: &Timing) {
    println!(
        "{}",
        Line::new("cuda_gemm")
            .field("dtype", dtype)
            .field("n", n)
            .timing(t)
            .field(
                "tflops",
                format!("{:.1}", flops / (t.median_us() * 1e-6) / 1e12)
            )
    );
}

/// The one fused CUDA kernel emitted for `BenchKernels::chain`'s forward pass.
fn chain_kernel() -> Result<KernelSource> {
    let ir = BenchKernels::graph()?;
    model_kernels(&ir, Target::Cuda)
        .into_iter()
        .find(|k| k.name.contains("_chain_forward_") && k.inputs == 1 && k.outputs == 1)
        .ok_or_else(|| {
            RtxError::Invalid("no single fused kernel was emitted for BenchKernels::chain".into())
        })
}

/// The chain `relu(x * 2.0 + 1.0) * 0.5 - 0.25` as the fused kernel emitted for
/// `BenchKernels::chain`, and a device-to-device copy of as many floats: both move one read
/// and one write of `n` f32, so `gbps` is effective bandwidth and `ratio_to_copy` is the
/// chain's share of what the memory allows.
pub(super) fn cuda_chain() -> Result<()> {
    let Some(d) = open("cuda_chain") else {
        return Ok(());
    };
    let chain = chain_kernel()?;
    let kernel = CudaKernel {
        name: &chain.name,
        source: &chain.source,
        entry: &chain.entry,
    };
    for n in [1usize << 24, 1 << 28] {
        let x = d.upload(&random(n, 3)).map_err(gpu)?;
        let mut y: CudaBuffer<f32> = d.zeros(n).map_err(gpu)?;
        let meta = Meta::words(&[n as u32], &[(0, vec![1])], Rounding::NONE.words());
        let bytes = 2.0 * n as f64 * 4.0;
        let fused = measure_gpu(&d, || {
            d.run_emitted(&kernel, &meta, &[&x], &mut [&mut y], n, POINTWISE_GROUP)
        })?;
        // The chain's result, checked once against the CPU's formula on a few elements.
        let (xs, ys) = (d.read(&x).map_err(gpu)?, d.read(&y).map_err(gpu)?);
        for i in (0..n).step_by(n / 7) {
            let want = (xs[i] * 2.0 + 1.0).max(0.0) * 0.5 - 0.25;
            if (ys[i] - want).abs() > 1e-6 {
                return Err(RtxError::Invalid(format!(
                    "the CUDA chain gave {} at element {i}, the CPU {want}",
                    ys[i]
                )));
            }
        }
        let copy = measure_gpu(&d, || d.copy(&x, &mut y))?;
        let gbps = |t: &Timing| bytes / (t.median_us() * 1e-6) / 1e9;
        println!(
            "{}",
            Line::new("cuda_chain")
                .field("n", n)
                .timing(&fused)
                .field("gbps", format!("{:.0}", gbps(&fused)))
                .field(
                    "ratio_to_copy",
                    format!("{:.3}", gbps(&fused) / gbps(&copy))
                )
        );
        println!(
            "{}",
            Line::new("cuda_copy")
                .field("n", n)
                .timing(&copy)
                .field("gbps", format!("{:.0}", gbps(&copy)))
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_chain_is_one_emitted_cuda_kernel_of_the_five_ops() {
        let k = super::chain_kernel().unwrap();
        for op in ["rtx_mul", "rtx_add", "rtx_relu", "rtx_sub"] {
            assert!(k.source.contains(op), "{op} missing from {}", k.source);
        }
    }
}
