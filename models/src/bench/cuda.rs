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
        let (ba, bb) = (
            d.upload_f32(&a).map_err(gpu)?,
            d.upload_f32(&b).map_err(gpu)?,
        );
        let c: CudaBuffer = d.zeros(n * n).map_err(gpu)?;
        let t = measure_gpu(&d, || d.gemm_f32(shape, &ba, &bb, &c))?;
        print_gemm("f32", n, flops, &t);
        drop((ba, bb, c));
        let bits = |v: &[f32]| -> Vec<u16> {
            v.iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect()
        };
        let (ha, hb) = (
            d.upload_bf16(&bits(&a)).map_err(gpu)?,
            d.upload_bf16(&bits(&b)).map_err(gpu)?,
        );
        let hc: CudaBuffer = d.zeros((n * n).div_ceil(2)).map_err(gpu)?;
        let t = measure_gpu(&d, || d.gemm_bf16(shape, &ha, &hb, &hc))?;
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
        let x = d.upload_f32(&random(n, 3)).map_err(gpu)?;
        let y: CudaBuffer = d.zeros(n).map_err(gpu)?;
        let meta = Meta::words(&[n as u32], &[(0, vec![1])], Rounding::NONE.words());
        let bytes = 2.0 * n as f64 * 4.0;
        let fused = measure_gpu(&d, || {
            d.run_emitted(&kernel, &meta, &[&x], &[&y], n, POINTWISE_GROUP)
        })?;
        // The chain's result, checked once against the CPU's formula on a few elements.
        let (xs, ys) = (d.read_f32(&x).map_err(gpu)?, d.read_f32(&y).map_err(gpu)?);
        for i in (0..n).step_by(n / 7) {
            let want = (xs[i] * 2.0 + 1.0).max(0.0) * 0.5 - 0.25;
            if (ys[i] - want).abs() > 1e-6 {
                return Err(RtxError::Invalid(format!(
                    "the CUDA chain gave {} at element {i}, the CPU {want}",
                    ys[i]
                )));
            }
        }
        let copy = measure_gpu(&d, || d.copy(&x, &y))?;
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

/// Training steps on the CUDA device, as `models train --device cuda` runs them: the digits
/// MLP (64-128-10, batch 256, dropout on, AdamW) and the GPT (4 layers, width 128, context
/// 64, batch 32; clipping at 1, AdamW), each timed on the host from the call to the device
/// being idle again (`Gpu::finish` after each step), as PyTorch's steps are timed with
/// `torch.cuda.synchronize()` by `scripts/bench_gpu_peers.py`.
pub(super) fn cuda_steps() -> Result<()> {
    use crate::gpt::{CONTEXT, Gpt};
    use crate::mlp::Mlp;
    use rtx_core::schedule::clip_grad_norm;
    let device = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("# skipped: cuda_steps: {e}");
            return Ok(());
        }
    };
    let finish = |d: &Device| -> Result<()> {
        match d.gpu() {
            Some(g) => g.finish().map_err(gpu),
            None => Ok(()),
        }
    };
    let (x, y) = super::steps::random_batch(1, &[256, 64])?;
    let (x, y) = (x.to(&device)?, y.to(&device)?);
    let mut mlp = Mlp::init(0);
    mlp.to(&device)?;
    let mut opt = AdamW::new(1e-3);
    let mut ctx = Ctx::train(0);
    let timing = super::measure(super::Plan::new(20, 300, 3_000), || {
        let (loss, grads) = mlp.loss_and_grads(&mut ctx, &x, &y)?;
        opt.step(&mut mlp, &grads)?;
        std::hint::black_box(loss);
        finish(&device)
    })?;
    println!(
        "{}",
        Line::new("cuda_mlp_step")
            .field("batch", 256)
            .timing(&timing)
    );
    let batch = 32;
    let mut rng = Rng::new(3);
    let ids = |rng: &mut Rng| -> Result<Tensor> {
        let v = (0..batch * CONTEXT)
            .map(|_| rng.below(crate::corpus::VOCAB) as i64)
            .collect();
        Tensor::from_i64(v, &[batch, CONTEXT])?.to(&device)
    };
    let (x, y) = (ids(&mut rng)?, ids(&mut rng)?);
    let mut gpt = Gpt::init(0);
    gpt.to(&device)?;
    let mut opt = AdamW::new(1e-3).weight_decay(0.1).betas(0.9, 0.99);
    let timing = super::measure(super::Plan::new(5, 100, 5_000), || {
        let (loss, mut grads) = gpt.loss_and_grads(&mut ctx, &x, &y)?;
        clip_grad_norm(&mut grads, 1.0)?;
        opt.step(&mut gpt, &grads)?;
        std::hint::black_box(loss);
        finish(&device)
    })?;
    let tokens_per_s = (batch * CONTEXT) as f64 / (timing.median_us() * 1e-6);
    println!(
        "{}",
        Line::new("cuda_gpt_step")
            .field("batch", batch)
            .timing(&timing)
            .field("tokens_per_s", format!("{tokens_per_s:.0}"))
    );
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
