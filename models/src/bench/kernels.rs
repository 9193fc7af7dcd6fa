//! The benchmarks of single kernels: convolution and pooling layers, the elementwise chain
//! beside a copy, and GEMM (square, layer shapes, bf16).

use super::{Line, Plan, Timing, measure, measure_cold, normal_vec};
use crate::bench_models::BenchKernels;
use rtx_core::prelude::*;
use std::hint::black_box;

/// The CNN's layers alone at batch 32, through the kernel entry points: each convolution
/// forward and both of its gradients, each max-pool forward and gradient (the digits CNN:
/// conv 1->16 on 8x8 and 16->32 on 4x4, 3x3 kernels, padding 1; 2x2 pools), and a wider
/// ResNet-style 3x3 convolution (64->64 on 32x32, batch 8). They run on a thread of rayon's
/// pool, as the kernels of a compiled training step do.
pub(super) fn cnn_layers() -> Result<()> {
    rtx_core::parallel::run(usize::MAX, cnn_layers_in_pool)
}

fn cnn_layers_in_pool() -> Result<()> {
    use rtx_backends::{Layout, cpu, pool::give_back};
    let plan = Plan::new(20, 500, 1_500);
    let mut rng = Rng::new(7);
    let mut random = |shape: &[usize]| {
        let n = shape.iter().product();
        (normal_vec(&mut rng, n), Layout::contiguous(shape))
    };
    let report = |layer: &str, op: &str, timing: &Timing| {
        println!(
            "{}",
            Line::new("cnn_layer")
                .field("layer", layer)
                .field("op", op)
                .timing(timing)
        );
    };
    for (layer, x_shape, w_shape) in [
        ("conv1", [32, 1, 8, 8], [16, 1, 3, 3]),
        ("conv2", [32, 16, 4, 4], [32, 16, 3, 3]),
        // A ResNet-style 3x3 layer, where the column matrix (576 x 8192) is 18 MiB.
        ("wide", [8, 64, 32, 32], [64, 64, 3, 3]),
    ] {
        let ((x, lx), (w, lw)) = (random(&x_shape), random(&w_shape));
        let out_shape = [x_shape[0], w_shape[0], x_shape[2], x_shape[3]];
        let (g, lg) = random(&out_shape);
        let (s, p) = ([1, 1], [1, 1]);
        let forward = measure(plan, || {
            give_back(black_box(cpu::conv2d(&x, &lx, &w, &lw, s, p)?.0));
            Ok(())
        })?;
        report(layer, "forward", &forward);
        let grad_input = measure(plan, || {
            give_back(black_box(cpu::conv2d_grad_input(
                &g, &lg, &w, &lw, &x_shape, s, p,
            )?));
            Ok(())
        })?;
        report(layer, "grad_input", &grad_input);
        let grad_weight = measure(plan, || {
            give_back(black_box(cpu::conv2d_grad_weight(
                &x, &lx, &g, &lg, &w_shape, s, p,
            )?));
            Ok(())
        })?;
        report(layer, "grad_weight", &grad_weight);
    }
    for (layer, x_shape) in [("pool1", [32, 16, 8, 8]), ("pool2", [32, 32, 4, 4])] {
        let (x, lx) = random(&x_shape);
        let (g, lg) = random(&[x_shape[0], x_shape[1], x_shape[2] / 2, x_shape[3] / 2]);
        let k = [2, 2];
        let forward = measure(plan, || {
            give_back(black_box(cpu::max_pool2d(&x, &lx, k, k, [0, 0])?.0));
            Ok(())
        })?;
        report(layer, "forward", &forward);
        let grad = measure(plan, || {
            give_back(black_box(cpu::max_pool2d_grad(
                &x,
                &lx,
                &g,
                &lg,
                k,
                k,
                [0, 0],
            )?));
            Ok(())
        })?;
        report(layer, "grad_input", &grad);
    }
    Ok(())
}

/// Elements of the elementwise benchmarks: 16M f32, 64 MiB per buffer, far beyond the caches.
const STREAM_LEN: usize = 16 * 1024 * 1024;

/// Effective bandwidth in GB/s (1e9 bytes) of moving `bytes` in `micros`.
fn gbps(bytes: usize, micros: f64) -> f64 {
    bytes as f64 / (micros * 1e-6) / 1e9
}

/// The 5-op chain of `BenchKernels::chain` next to a plain copy of as many floats, measured in
/// the same run. Both count one read and one write of 16M f32: for the chain that is the
/// traffic a fused kernel would need, so `gbps` is effective bandwidth and `ratio_to_copy`
/// says how far the unfused chain is from the memory bound. The copy is `copy_from_slice` on
/// one thread (a memcpy); on this kind of machine one core comes close to the memory bus.
pub(super) fn elementwise_chain() -> Result<()> {
    let mut rng = Rng::new(3);
    let source: Vec<f32> = (0..STREAM_LEN).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let bytes = 2 * STREAM_LEN * std::mem::size_of::<f32>();

    let kernels = BenchKernels::init(0);
    let x = Tensor::from_vec(source.clone(), &[STREAM_LEN])?;
    let chain = measure(Plan::new(2, 20, 6_000), || {
        black_box(kernels.chain(&x)?);
        Ok(())
    })?;

    // Preallocated and written once, so the timed copies do not pay first-touch page faults.
    // The reference is a copy on as many threads as the chain runs on (rayon's pool, in equal
    // chunks): a one-thread copy cannot use all of the machine's bandwidth, so a chain on
    // two threads would look faster than memory allows. The one-thread copy is reported too.
    let mut destination = vec![1.0f32; STREAM_LEN];
    let threads = rayon::current_num_threads().max(1);
    let chunk = STREAM_LEN.div_ceil(threads);
    let copy = measure(Plan::new(2, 30, 3_000), || {
        use rayon::prelude::*;
        destination
            .par_chunks_mut(chunk)
            .zip(black_box(&source).par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&mut destination);
        Ok(())
    })?;
    let copy_one_thread = measure(Plan::new(2, 30, 3_000), || {
        destination.copy_from_slice(black_box(&source));
        black_box(&mut destination);
        Ok(())
    })?;

    let chain_gbps = gbps(bytes, chain.median_us());
    let copy_gbps = gbps(bytes, copy.median_us());
    let one_thread_gbps = gbps(bytes, copy_one_thread.median_us());
    println!(
        "{}",
        Line::new("elementwise_chain")
            .field("n", STREAM_LEN)
            .field("ops", 5)
            .timing(&chain)
            .field("gbps", format!("{chain_gbps:.2}"))
            .field("ratio_to_copy", format!("{:.3}", chain_gbps / copy_gbps))
    );
    println!(
        "{}",
        Line::new("copy")
            .field("n", STREAM_LEN)
            .field("threads", threads)
            .timing(&copy)
            .field("gbps", format!("{copy_gbps:.2}"))
    );
    println!(
        "{}",
        Line::new("copy_one_thread")
            .field("n", STREAM_LEN)
            .timing(&copy_one_thread)
            .field("gbps", format!("{one_thread_gbps:.2}"))
    );
    Ok(())
}

/// Square f32 GEMM through the DSL (`BenchKernels::square_matmul`, i.e. `run_op(MatMul)` on
/// contiguous inputs, the packed kernel of rtx-backends). GFLOP/s counts 2 n^3 flops.
pub(super) fn gemm() -> Result<()> {
    let kernels = BenchKernels::init(0);
    for (n, plan) in SQUARE_SIZES {
        let mut rng = Rng::new(4 + n as u64);
        let a = Tensor::from_vec(normal_vec(&mut rng, n * n), &[n, n])?;
        let b = Tensor::from_vec(normal_vec(&mut rng, n * n), &[n, n])?;
        let timing = measure(plan, || {
            black_box(kernels.square_matmul(&a, &b)?);
            Ok(())
        })?;
        let flops = 2.0 * (n as f64).powi(3);
        let gflops = flops / (timing.median_us() * 1e-6) / 1e9;
        println!(
            "{}",
            Line::new("gemm")
                .field("n", n)
                .timing(&timing)
                .field("gflops", format!("{gflops:.1}"))
        );
    }
    Ok(())
}

/// The products of the MLP and transformer layers, `[m, k] @ [k, n]`, each in the three forms
/// a training step runs: `nn` (both row-major), `nt` (B a row-major `[n, k]` weight read
/// transposed: the forward pass of a Linear) and `tn` (A a row-major `[k, m]` read transposed:
/// a weight gradient `x^T dY`; with its bias gradient, `tn_row_sums`, and that again with both
/// operands cold, `tn_row_sums_cold`, as a step runs it), through the kernel entry point on a
/// thread of rayon's pool.
pub(super) fn gemm_shapes() -> Result<()> {
    rtx_core::parallel::run(usize::MAX, gemm_shapes_in_pool)
}

/// `(m, k, n)` of `gemm_shapes`; the last four are the GPT step's (batch 32 x context 64 =
/// 2048 rows, width 128, MLP 512): a projection, the MLP's down projection, and two weight
/// gradients (`tn` is theirs).
const GEMM_SHAPES: [(usize, usize, usize); 8] = [
    (256, 64, 128),
    (256, 128, 10),
    (256, 1024, 1024),
    (1024, 128, 512),
    (2048, 128, 128),
    (2048, 512, 128),
    (128, 2048, 512),
    (512, 2048, 128),
];

fn gemm_shapes_in_pool() -> Result<()> {
    use rtx_backends::{Layout, cpu, pool::give_back};
    for (m, k, n) in GEMM_SHAPES {
        let mut rng = Rng::new((m * 31 + k * 7 + n) as u64);
        let a = normal_vec(&mut rng, m * k);
        let b = normal_vec(&mut rng, k * n);
        let forms = [
            (
                "nn",
                Layout::contiguous(&[m, k]),
                Layout::contiguous(&[k, n]),
            ),
            (
                "nt",
                Layout::contiguous(&[m, k]),
                Layout::contiguous(&[n, k]).permute(&[1, 0]),
            ),
            (
                "tn",
                Layout::contiguous(&[k, m]).permute(&[1, 0]),
                Layout::contiguous(&[k, n]),
            ),
        ];
        let flops = 2.0 * (m * k * n) as f64;
        let plan = if flops > 1e8 {
            Plan::new(3, 50, 2_000)
        } else {
            Plan::new(20, 500, 1_000)
        };
        let report = |form: &str, timing: &Timing| {
            let gflops = flops / (timing.median_us() * 1e-6) / 1e9;
            println!(
                "{}",
                Line::new("gemm_shape")
                    .field("m", m)
                    .field("k", k)
                    .field("n", n)
                    .field("op", form)
                    .timing(timing)
                    .field("gflops", format!("{gflops:.1}"))
            );
        };
        for (form, la, lb) in forms {
            let timing = measure(plan, || {
                give_back(black_box(cpu::matmul(&a, &la, &b, &lb)?.0));
                Ok(())
            })?;
            report(form, &timing);
            if form == "tn" {
                // A weight gradient with its bias gradient: the row sums ride on packing.
                let timing = measure(plan, || {
                    let (product, sums, _) = cpu::matmul_row_sums(&a, &la, &b, &lb)?;
                    give_back(black_box(product));
                    give_back(black_box(sums));
                    Ok(())
                })?;
                report("tn_row_sums", &timing);
                // The same, as a step runs it: both operands cold.
                let timing = measure_cold(30, || {
                    let (product, sums, _) = cpu::matmul_row_sums(&a, &la, &b, &lb)?;
                    give_back(black_box(product));
                    give_back(black_box(sums));
                    Ok(())
                })?;
                report("tn_row_sums_cold", &timing);
            }
        }
    }
    Ok(())
}

/// The square sizes of the GEMM benches, each with its measurement plan.
const SQUARE_SIZES: [(usize, Plan); 4] = [
    (256, Plan::new(10, 200, 2_000)),
    (512, Plan::new(3, 60, 2_500)),
    (1024, Plan::new(2, 20, 3_000)),
    (2048, Plan::new(1, 5, 4_000)),
];

/// A square GEMM of half-precision operands with f32 accumulation and result, through a
/// kernel entry point (`matmul`): half-precision tensors do not exist in the DSL yet. Each
/// line is named `name`, with `extra` fields after the figures.
fn gemm_half<T>(
    name: &'static str,
    seed: u64,
    from_f32: fn(f32) -> T,
    matmul: impl Fn(&[T], &rtx_backends::Layout, &[T], &rtx_backends::Layout) -> Result<Vec<f32>>,
    extra: &[(&'static str, String)],
) -> Result<()> {
    for (n, plan) in SQUARE_SIZES {
        let mut rng = Rng::new(seed + n as u64);
        let mut operand = || -> Vec<T> {
            normal_vec(&mut rng, n * n)
                .into_iter()
                .map(from_f32)
                .collect()
        };
        let (a, b) = (operand(), operand());
        let l = rtx_backends::Layout::contiguous(&[n, n]);
        let timing = measure(plan, || {
            rtx_backends::pool::give_back(black_box(matmul(&a, &l, &b, &l)?));
            Ok(())
        })?;
        let gflops = 2.0 * (n as f64).powi(3) / (timing.median_us() * 1e-6) / 1e9;
        let mut line = Line::new(name)
            .field("n", n)
            .timing(&timing)
            .field("gflops", format!("{gflops:.1}"));
        for (key, value) in extra {
            line = line.field(key, value);
        }
        println!("{line}");
    }
    Ok(())
}

/// Square bf16 GEMM (`rtx_backends::cpu::matmul_bf16`); the `kernel` field says which bf16
/// kernel ran.
pub(super) fn gemm_bf16() -> Result<()> {
    use rtx_backends::cpu;
    let kernel = format!("{:?}", cpu::bf16_kernel());
    gemm_half(
        "gemm_bf16",
        40,
        half::bf16::from_f32,
        |a, la, b, lb| Ok(cpu::matmul_bf16(a, la, b, lb)?.0),
        &[("kernel", kernel)],
    )
}

/// Square f16 GEMM (`rtx_backends::cpu::matmul_f16`: widened with F16C, then the f32 GEMM).
pub(super) fn gemm_f16() -> Result<()> {
    use rtx_backends::cpu;
    gemm_half(
        "gemm_f16",
        50,
        half::f16::from_f32,
        |a, la, b, lb| Ok(cpu::matmul_f16(a, la, b, lb)?.0),
        &[],
    )
}

/// The GPT's causal attention alone, forward and backward, on its head split: q, k and v
/// `[32, 4, 64, 32]` read as permuted views of `[B, T, H, D]` rows, as `split_heads` gives
/// them. GFLOP/s count the products a causal pass needs (half the `T x T` scores, two products
/// forward, five backward with the recomputed scores).
pub(super) fn attention() -> Result<()> {
    rtx_core::parallel::run(usize::MAX, attention_in_pool)
}

fn attention_in_pool() -> Result<()> {
    use rtx_backends::{Layout, cpu, pool::give_back};
    let (b, h, t, d) = (32, 4, 64, 32);
    let mut rng = Rng::new(11);
    let heads = Layout::contiguous(&[b, t, h, d]).permute(&[0, 2, 1, 3]);
    let q = normal_vec(&mut rng, b * t * h * d);
    let k = normal_vec(&mut rng, b * t * h * d);
    let v = normal_vec(&mut rng, b * t * h * d);
    let g = normal_vec(&mut rng, b * t * h * d);
    let contiguous = Layout::contiguous(&[b, h, t, d]);
    let product = (b * h * t * t * d) as f64; // multiply-adds of one full product, x2 flops, /2 causal
    let plan = Plan::new(20, 300, 1_500);
    let report = |op: &str, products: f64, timing: &Timing| {
        let gflops = products * product / (timing.median_us() * 1e-6) / 1e9;
        println!(
            "{}",
            Line::new("attention")
                .field("shape", format!("{b}x{h}x{t}x{d}"))
                .field("op", op)
                .timing(timing)
                .field("gflops", format!("{gflops:.1}"))
        );
    };
    let forward = measure(plan, || {
        let (out, _) = cpu::attention((&q, &heads), (&k, &heads), (&v, &heads), true)?;
        give_back(black_box(out));
        Ok(())
    })?;
    report("forward", 2.0, &forward);
    let backward = measure(plan, || {
        let (out, _) = cpu::attention_grad(
            (&q, &heads),
            (&k, &heads),
            (&v, &heads),
            (&g, &contiguous),
            true,
        )?;
        give_back(black_box(out));
        Ok(())
    })?;
    report("backward", 5.0, &backward);
    Ok(())
}
