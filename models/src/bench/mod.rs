//! `models bench`: wall-clock benchmarks of training steps, inference, an elementwise chain and
//! GEMM, printed one result per line as `bench=<name> key=value ...` so that
//! `scripts/bench_peers.py` can parse them and set them next to PyTorch and NumPy.
//!
//! Method: each piece of work runs untimed warm-up iterations (at least a few, and for at least
//! `MIN_WARMUP`: first-touch page faults, rayon pool start-up, the model IR being parsed once), then timed iterations measured one by
//! one with `Instant`; the line reports the median (robust to the odd scheduler hiccup) and the
//! minimum. Big workloads stop early at a time budget so the whole run stays well under two
//! minutes; `iters=` says how many timed iterations a figure rests on.

#[cfg(feature = "cuda")]
mod cuda;
mod kernels;
mod memory;
mod steps;

use kernels::{attention, cnn_layers, elementwise_chain, gemm, gemm_bf16, gemm_f16, gemm_shapes};
use memory::memory;
use rtx_core::prelude::*;
use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};
use steps::{cnn_step, gpt_step, mlp_forward, mlp_step_small, mlp_step_wide};

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

/// Warm-up lasts at least this long, however many iterations that takes: a plan's count of
/// iterations of a 200 µs step is a few milliseconds, too short to be sure that start-up
/// effects (first-touch page faults, pool threads starting, clock ramp-up) are over.
const MIN_WARMUP: Duration = Duration::from_millis(300);

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
    let warming = Instant::now();
    let mut warmed = 0;
    while warmed < plan.warmup || warming.elapsed() < MIN_WARMUP {
        work()?;
        warmed += 1;
    }
    // With `RTX_PROFILE=1` the step table covers the timed iterations only.
    rtx_core::profile::reset();
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
    if let Some(table) = rtx_core::profile::report(samples_us.len() as u64) {
        eprintln!("{table}");
        rtx_core::profile::reset();
    }
    Ok(Timing { samples_us })
}

/// `iters` timed runs of `work`, each after the caches are emptied (64 MiB written, more
/// than this machine's L3), with no warm-up: a weight gradient in a training step reads
/// activations the forward pass wrote long before, which a repeated warm run keeps in cache.
fn measure_cold(iters: usize, mut work: impl FnMut() -> Result<()>) -> Result<Timing> {
    let mut evict = vec![0u8; 64 << 20];
    let mut samples_us = Vec::with_capacity(iters);
    for i in 0..iters {
        evict.fill(i as u8);
        black_box(&evict);
        let t = Instant::now();
        work()?;
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
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
        names: &["gpt_step"],
        run: gpt_step,
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
        names: &["memory"],
        run: memory,
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
        names: &["gemm_f16"],
        run: gemm_f16,
    },
    Group {
        names: &["gemm_shape"],
        run: gemm_shapes,
    },
    Group {
        names: &["attention"],
        run: attention,
    },
    #[cfg(feature = "cuda")]
    Group {
        names: &["cuda_gemm"],
        run: cuda::cuda_gemm,
    },
    #[cfg(feature = "cuda")]
    Group {
        names: &["cuda_chain", "cuda_copy"],
        run: cuda::cuda_chain,
    },
    #[cfg(feature = "cuda")]
    Group {
        names: &["cuda_mlp_step", "cuda_gpt_step"],
        run: cuda::cuda_steps,
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
