//! `models bench`: wall-clock benchmarks of training steps, inference, an elementwise chain and
//! GEMM, printed one result per line as `bench=<name> key=value ...` so that
//! `scripts/bench_peers.py` can parse them and set them next to PyTorch and NumPy.
//!
//! Method: each piece of work runs a few untimed warm-up iterations (first-touch page faults,
//! rayon pool start-up, the model IR being parsed once), then timed iterations measured one by
//! one with `Instant`; the line reports the median (robust to the odd scheduler hiccup) and the
//! minimum. Big workloads stop early at a time budget so the whole run stays well under two
//! minutes; `iters=` says how many timed iterations a figure rests on.

use crate::bench_models::{BenchKernels, WideMlp};
use crate::cnn::Cnn;
use crate::mlp::Mlp;
use rtx_core::prelude::*;
use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// How long to run one piece of work.
#[derive(Clone, Copy, Debug)]
struct Plan {
    warmup: usize,
    /// Timed iterations wanted...
    iters: usize,
    /// ...unless the timed loop has used this much wall time, once `MIN_ITERS` are done.
    budget: Duration,
}

/// Fewest timed iterations behind any median, whatever the budget.
const MIN_ITERS: usize = 3;

impl Plan {
    const fn new(warmup: usize, iters: usize, budget_ms: u64) -> Plan {
        Plan {
            warmup,
            iters,
            budget: Duration::from_millis(budget_ms),
        }
    }
}

/// Per-iteration wall times of one measurement, in microseconds.
#[derive(Clone, Debug)]
struct Timing {
    samples_us: Vec<f64>,
}

impl Timing {
    fn median_us(&self) -> f64 {
        median(&self.samples_us)
    }
    fn min_us(&self) -> f64 {
        self.samples_us
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }
    fn iters(&self) -> usize {
        self.samples_us.len()
    }
}

/// Median of `values` (mean of the middle two for an even count); NaN when empty.
fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// Runs `work` as `plan` says; an error from `work` stops the measurement and is returned.
fn measure(plan: Plan, mut work: impl FnMut() -> Result<()>) -> Result<Timing> {
    for _ in 0..plan.warmup {
        work()?;
    }
    let started = Instant::now();
    let mut samples_us = Vec::with_capacity(plan.iters);
    while samples_us.len() < plan.iters.max(MIN_ITERS) {
        let t = Instant::now();
        work()?;
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
        if samples_us.len() >= MIN_ITERS && started.elapsed() >= plan.budget {
            break;
        }
    }
    Ok(Timing { samples_us })
}

/// One output line: `bench=<name>` followed by `key=value` fields in insertion order.
struct Line {
    name: &'static str,
    fields: Vec<(&'static str, String)>,
}

impl Line {
    fn new(name: &'static str) -> Line {
        Line {
            name,
            fields: Vec::new(),
        }
    }
    fn field(mut self, key: &'static str, value: impl fmt::Display) -> Line {
        self.fields.push((key, value.to_string()));
        self
    }
    /// Appends the median, minimum and iteration count of `t`.
    fn timing(self, t: &Timing) -> Line {
        self.field("median_us", format!("{:.1}", t.median_us()))
            .field("min_us", format!("{:.1}", t.min_us()))
            .field("iters", t.iters())
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bench={}", self.name)?;
        for (key, value) in &self.fields {
            write!(f, " {key}={value}")?;
        }
        Ok(())
    }
}

/// A group of results measured together; it runs when the filter is part of any of `names`
/// (the elementwise chain and its copy reference share one run, so their ratio is fair).
struct Group {
    names: &'static [&'static str],
    run: fn() -> Result<()>,
}

const GROUPS: &[Group] = &[
    Group {
        names: &["mlp_step_64_128_10", "mlp_step_64_128_10_unfused"],
        run: mlp_step_small,
    },
    Group {
        names: &[
            "mlp_step_64_1024_1024_10",
            "mlp_step_64_1024_1024_10_unfused",
        ],
        run: mlp_step_wide,
    },
    Group {
        names: &["mlp_forward"],
        run: mlp_forward,
    },
    Group {
        names: &["cnn_step"],
        run: cnn_step,
    },
    Group {
        names: &["cnn_layer"],
        run: cnn_layers,
    },
    Group {
        names: &["elementwise_chain", "copy"],
        run: elementwise_chain,
    },
    Group {
        names: &["gemm"],
        run: gemm,
    },
    Group {
        names: &["gemm_bf16"],
        run: gemm_bf16,
    },
    Group {
        names: &["gemm_shape"],
        run: gemm_shapes,
    },
];

/// Every result name `models bench` can print, for `--filter` and its error message.
pub fn bench_names() -> Vec<&'static str> {
    GROUPS
        .iter()
        .flat_map(|g| g.names.iter().copied())
        .collect()
}

fn selected(group: &Group, filter: Option<&str>) -> bool {
    filter.is_none_or(|f| group.names.iter().any(|name| name.contains(f)))
}

/// Runs the benchmarks whose name contains `filter` (all when `None`), printing each result
/// as soon as it is measured. A filter that matches nothing is an error naming the choices.
pub fn run(filter: Option<&str>) -> Result<()> {
    let chosen: Vec<&Group> = GROUPS.iter().filter(|g| selected(g, filter)).collect();
    if chosen.is_empty() {
        return Err(RtxError::Invalid(format!(
            "no benchmark name contains `{}`; the names are {}",
            filter.unwrap_or_default(),
            bench_names().join(", ")
        )));
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "# models bench: median of timed iterations after warm-up; {threads} hardware threads (rayon's default pool size unless RAYON_NUM_THREADS is set)"
    );
    for group in chosen {
        (group.run)()?;
    }
    Ok(())
}

/// `n` draws from N(0, 1), so no kernel sees an all-zero (or otherwise special) input.
fn normal_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

/// A random f32 tensor of `shape` and, for classifiers, `batch` labels in 0..10.
fn random_batch(seed: u64, shape: &[usize]) -> Result<(Tensor, Tensor)> {
    let mut rng = Rng::new(seed);
    let numel = shape.iter().product();
    let x = Tensor::from_vec(normal_vec(&mut rng, numel), shape)?;
    let batch = shape.first().copied().unwrap_or(1);
    let labels = (0..batch).map(|_| rng.below(10) as i64).collect();
    let y = Tensor::from_i64(labels, &[batch])?;
    Ok((x, y))
}

/// Signature shared by the generated `loss_and_grads` of the classifiers benchmarked here.
type LossAndGrads<M> = fn(&M, &mut Ctx, &Tensor, &Tensor) -> Result<(Tensor, Grads)>;

/// One training step as `models train` runs it: compiled forward + backward (dropout on,
/// `Ctx::train`), then an AdamW update of every parameter.
fn train_step<M: Module>(
    name: &'static str,
    model: M,
    loss_and_grads: LossAndGrads<M>,
    input_shape: &[usize],
    plan: Plan,
) -> Result<()> {
    train_step_with(name, model, loss_and_grads, input_shape, plan, true)
}

/// `train_step` with fusion on or off (`Ctx::with_fusion`), to show what fusion buys.
fn train_step_with<M: Module>(
    name: &'static str,
    mut model: M,
    loss_and_grads: LossAndGrads<M>,
    input_shape: &[usize],
    plan: Plan,
    fused: bool,
) -> Result<()> {
    let (x, y) = random_batch(1, input_shape)?;
    let mut opt = AdamW::new(1e-3);
    let mut ctx = Ctx::train(0).with_fusion(fused);
    let timing = measure(plan, || {
        let (loss, grads) = loss_and_grads(&model, &mut ctx, &x, &y)?;
        opt.step(&mut model, &grads)?;
        black_box(loss);
        Ok(())
    })?;
    let batch = input_shape.first().copied().unwrap_or(1);
    println!("{}", Line::new(name).field("batch", batch).timing(&timing));
    Ok(())
}

fn mlp_step_small() -> Result<()> {
    let plan = Plan::new(20, 300, 3_000);
    for (name, fused) in [
        ("mlp_step_64_128_10", true),
        ("mlp_step_64_128_10_unfused", false),
    ] {
        train_step_with(
            name,
            Mlp::init(0),
            Mlp::loss_and_grads,
            &[256, 64],
            plan,
            fused,
        )?;
    }
    Ok(())
}

fn mlp_step_wide() -> Result<()> {
    let plan = Plan::new(3, 50, 5_000);
    for (name, fused) in [
        ("mlp_step_64_1024_1024_10", true),
        ("mlp_step_64_1024_1024_10_unfused", false),
    ] {
        train_step_with(
            name,
            WideMlp::init(0),
            WideMlp::loss_and_grads,
            &[256, 64],
            plan,
            fused,
        )?;
    }
    Ok(())
}

fn cnn_step() -> Result<()> {
    train_step(
        "cnn_step",
        Cnn::init(0),
        Cnn::loss_and_grads,
        &[32, 1, 8, 8],
        Plan::new(10, 300, 3_000),
    )
}

/// The CNN's layers alone at batch 32, through the kernel entry points: each convolution
/// forward and both of its gradients, each max-pool forward and gradient (the digits CNN:
/// conv 1->16 on 8x8 and 16->32 on 4x4, 3x3 kernels, padding 1; 2x2 pools). They run on a
/// thread of rayon's pool, as the kernels of a compiled training step do.
fn cnn_layers() -> Result<()> {
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

/// Inference (`forward`, eval mode: dropout is the identity) at batch 1, where per-op
/// overhead dominates, and at batch 256.
fn mlp_forward() -> Result<()> {
    let model = Mlp::init(0);
    for batch in [1, 256] {
        let (x, _) = random_batch(2, &[batch, 64])?;
        let timing = measure(Plan::new(50, 2_000, 2_000), || {
            black_box(model.forward(&x)?);
            Ok(())
        })?;
        println!(
            "{}",
            Line::new("mlp_forward")
                .field("batch", batch)
                .timing(&timing)
        );
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
fn elementwise_chain() -> Result<()> {
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
    let mut destination = vec![1.0f32; STREAM_LEN];
    let copy = measure(Plan::new(2, 30, 3_000), || {
        destination.copy_from_slice(black_box(&source));
        black_box(&mut destination);
        Ok(())
    })?;

    let chain_gbps = gbps(bytes, chain.median_us());
    let copy_gbps = gbps(bytes, copy.median_us());
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
            .timing(&copy)
            .field("gbps", format!("{copy_gbps:.2}"))
    );
    Ok(())
}

/// Square f32 GEMM through the DSL (`BenchKernels::square_matmul`, i.e. `run_op(MatMul)` on
/// contiguous inputs, the packed kernel of rtx-backends). GFLOP/s counts 2 n^3 flops.
fn gemm() -> Result<()> {
    let kernels = BenchKernels::init(0);
    let sizes: [(usize, Plan); 4] = [
        (256, Plan::new(10, 200, 2_000)),
        (512, Plan::new(3, 60, 2_500)),
        (1024, Plan::new(2, 20, 3_000)),
        (2048, Plan::new(1, 5, 4_000)),
    ];
    for (n, plan) in sizes {
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
/// a weight gradient `x^T dY`), through the kernel entry point on a thread of rayon's pool.
fn gemm_shapes() -> Result<()> {
    rtx_core::parallel::run(usize::MAX, gemm_shapes_in_pool)
}

/// `(m, k, n)` of `gemm_shapes`.
const GEMM_SHAPES: [(usize, usize, usize); 4] = [
    (256, 64, 128),
    (256, 128, 10),
    (256, 1024, 1024),
    (1024, 128, 512),
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
        for (form, la, lb) in forms {
            let timing = measure(plan, || {
                give_back(black_box(cpu::matmul(&a, &la, &b, &lb)?.0));
                Ok(())
            })?;
            let gflops = flops / (timing.median_us() * 1e-6) / 1e9;
            println!(
                "{}",
                Line::new("gemm_shape")
                    .field("m", m)
                    .field("k", k)
                    .field("n", n)
                    .field("op", form)
                    .timing(&timing)
                    .field("gflops", format!("{gflops:.1}"))
            );
        }
    }
    Ok(())
}

/// Square bf16 GEMM (bf16 operands, f32 accumulation and result) through the kernel entry
/// point `rtx_backends::cpu::matmul_bf16`: bf16 tensors do not exist in the DSL yet. The
/// `kernel` field says which bf16 kernel this CPU runs.
fn gemm_bf16() -> Result<()> {
    use half::bf16;
    use rtx_backends::{Layout, cpu};
    let kernel = cpu::bf16_kernels().last().copied();
    let sizes: [(usize, Plan); 4] = [
        (256, Plan::new(10, 200, 2_000)),
        (512, Plan::new(3, 60, 2_500)),
        (1024, Plan::new(2, 20, 3_000)),
        (2048, Plan::new(1, 5, 4_000)),
    ];
    for (n, plan) in sizes {
        let mut rng = Rng::new(40 + n as u64);
        let a: Vec<bf16> = normal_vec(&mut rng, n * n)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let b: Vec<bf16> = normal_vec(&mut rng, n * n)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let l = Layout::contiguous(&[n, n]);
        let timing = measure(plan, || {
            let (out, _) = cpu::matmul_bf16(&a, &l, &b, &l)?;
            rtx_backends::pool::give_back(black_box(out));
            Ok(())
        })?;
        let gflops = 2.0 * (n as f64).powi(3) / (timing.median_us() * 1e-6) / 1e9;
        println!(
            "{}",
            Line::new("gemm_bf16")
                .field("n", n)
                .timing(&timing)
                .field("gflops", format!("{gflops:.1}"))
                .field("kernel", format!("{kernel:?}"))
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn filter_matches_substrings_of_any_name_in_a_group() {
        let names = |f: &str| -> Vec<&str> {
            GROUPS
                .iter()
                .filter(|g| selected(g, Some(f)))
                .map(|g| g.names[0])
                .collect()
        };
        assert_eq!(
            names("mlp_step"),
            ["mlp_step_64_128_10", "mlp_step_64_1024_1024_10"]
        );
        assert_eq!(names("copy"), ["elementwise_chain"]);
        assert!(names("nothing-like-this").is_empty());
        assert!(run(Some("nothing-like-this")).is_err());
    }

    #[test]
    fn measure_respects_min_iters_and_propagates_errors() -> Result<()> {
        let t = measure(Plan::new(0, 1, 0), || Ok(()))?;
        assert_eq!(t.iters(), MIN_ITERS);
        let mut calls = 0;
        let failed = measure(Plan::new(0, 5, 1_000), || {
            calls += 1;
            Err(RtxError::Invalid("boom".into()))
        });
        assert!(failed.is_err());
        assert_eq!(calls, 1);
        Ok(())
    }

    #[test]
    fn line_format_is_name_then_fields() {
        let line = Line::new("gemm").field("n", 256).field("gflops", "1.5");
        assert_eq!(line.to_string(), "bench=gemm n=256 gflops=1.5");
    }
}
