//! Where a compiled call's time goes, step by step: `RTX_PROFILE=1` (or [`set_enabled`]).
//!
//! A compiled graph function runs a schedule of steps (`slots.rs`): one kernel, a fused
//! pointwise group, a row group, a GEMM with its epilogue. With profiling on, every step is
//! timed and added to a table keyed by (function, step kind, node), so a training loop
//! accumulates the time of each step over all its calls; [`time`] adds work outside graph
//! functions (the optimizer step, gradient clipping) to the same table. [`report`] prints it,
//! largest total first, with GEMM throughput where a step's FLOP count is known, and a
//! summary by step kind and op. Off (the default), a step costs one branch.
//!
//! The times are wall-clock: a step's parallel work is inside its time, so the table's total
//! is the schedule's time, and what the table does not cover (binding, arena set-up, thread
//! hand-offs between steps) is the call's time minus that total.

use rtx_ir::GraphFn;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// 0: not yet read from the environment; 1: off; 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

static TABLE: Mutex<Option<HashMap<Key, Entry>>> = Mutex::new(None);

/// (address of the function's IR, or 0 outside graph functions; the call: `forward` or
/// `and_grads`; step kind; node id)
type Key = (usize, &'static str, &'static str, usize);

struct Entry {
    /// The row of the summary it adds to: step kind, pass and op (`matmul_fused bwd
    /// matmul+add`), or the name of a timed region.
    group: String,
    label: String,
    calls: u64,
    nanos: u128,
    flops: u64,
}

/// Whether steps are being timed: `RTX_PROFILE` set to anything but empty or `0`, unless
/// [`set_enabled`] said otherwise.
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var("RTX_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
            // Only the first reading settles it: a `set_enabled` made by another thread
            // while this one read the environment must not be overwritten (it was, and a
            // test saw its profile switched off halfway).
            match STATE.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => on,
                Err(set) => set == 2,
            }
        }
    }
}

/// Turns step timing on or off for calls that start after this (a `--profile` flag, tests).
pub fn set_enabled(on: bool) {
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Forgets every recorded step (a benchmark's warm-up calls, say).
pub fn reset() {
    if let Ok(mut table) = TABLE.lock() {
        *table = None;
    }
}

/// Adds one run of step `kind` at `node` of `f` that took `elapsed` and did `flops`
/// floating-point operations (0 when not counted).
pub(crate) fn record_step(
    f: Option<(&'static GraphFn, &'static str)>,
    kind: &'static str,
    node: usize,
    elapsed: Duration,
    flops: u64,
) {
    let (addr, call) = f.map_or((0, ""), |(f, call)| (f as *const GraphFn as usize, call));
    add((addr, call, kind, node), elapsed, flops, || match f {
        Some((f, call)) => step_label(f, call, kind, node),
        None => (kind.to_string(), format!("node {node}")),
    });
}

/// Runs `work`, adding its time to the table under `name` when profiling is on.
pub fn time<T>(name: &'static str, work: impl FnOnce() -> T) -> T {
    if !enabled() {
        return work();
    }
    let start = std::time::Instant::now();
    let value = work();
    add((0, "", name, 0), start.elapsed(), 0, || {
        (name.to_string(), String::new())
    });
    value
}

/// `label` gives the entry's summary group and its label, the first time `key` is seen.
fn add(key: Key, elapsed: Duration, flops: u64, label: impl FnOnce() -> (String, String)) {
    let Ok(mut table) = TABLE.lock() else { return };
    let entry = table
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| {
            let (group, label) = label();
            Entry {
                group,
                label,
                calls: 0,
                nanos: 0,
                flops: 0,
            }
        });
    entry.calls += 1;
    entry.nanos += elapsed.as_nanos();
    entry.flops += flops;
}

/// The summary group (`kernel fwd matmul`) and label (`fwd matmul [2048, 384]
/// (loss_and_grads)`: the pass, the node's op and shape, the call) of a step. A GEMM step
/// with an epilogue is named by its last op (`matmul+add`).
fn step_label(f: &GraphFn, call: &str, kind: &str, node: usize) -> (String, String) {
    let call = match call {
        "and_grads" => format!("{}_and_grads", f.name),
        _ => f.name.clone(),
    };
    let pass = if node < f.forward_len { "fwd" } else { "bwd" };
    match f.graph.nodes.get(node) {
        Some(n) => {
            let name = n.op.name();
            let op = if kind.starts_with("matmul") && name != "matmul" {
                format!("matmul+{name}")
            } else {
                name.to_string()
            };
            (
                format!("{kind} {pass} {op}"),
                format!("{pass} {op} {} ({call})", rtx_ir::fmt_shape(&n.shape)),
            )
        }
        None => (kind.to_string(), format!("{pass} node {node} ({call})")),
    }
}

/// The recorded steps as a table, largest total time first, with a summary by step kind and
/// op; `None` when nothing was recorded. `per` divides the totals (the number of training
/// steps, to read times per step; 1 for totals).
pub fn report(per: u64) -> Option<String> {
    let table = TABLE.lock().ok()?;
    let table = table.as_ref().filter(|t| !t.is_empty())?;
    let per = per.max(1) as f64;
    let mut rows: Vec<(&Key, &Entry)> = table.iter().collect();
    rows.sort_by(|a, b| b.1.nanos.cmp(&a.1.nanos).then(a.0.cmp(b.0)));
    let total: u128 = rows.iter().map(|(_, e)| e.nanos).sum();
    let ms = |nanos: u128| nanos as f64 / 1e6 / per;
    let share = |nanos: u128| 100.0 * nanos as f64 / total.max(1) as f64;
    let gflops = |e: &Entry| match e.flops {
        0 => String::new(),
        f => format!("{:.1}", f as f64 / e.nanos.max(1) as f64),
    };

    let mut out = String::new();
    let _ = writeln!(
        out,
        "profile: {:.2} ms in {} recorded steps{}",
        ms(total),
        rows.len(),
        if per > 1.0 {
            " (per training step)"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "\nby kind and op:");
    let mut groups: HashMap<String, (u128, u64, u64)> = HashMap::new();
    for (_, e) in &rows {
        let g = groups.entry(e.group.clone()).or_default();
        g.0 += e.nanos;
        g.1 += e.calls;
        g.2 += e.flops;
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>8} {:>8}  step",
        "share", "ms", "calls", "GFLOP/s"
    );
    for (name, (nanos, calls, flops)) in &groups {
        let rate = match flops {
            0 => String::new(),
            f => format!("{:.1}", *f as f64 / (*nanos).max(1) as f64),
        };
        let _ = writeln!(
            out,
            "{:>5.1}% {:>10.3} {:>8.0} {:>8}  {name}",
            share(*nanos),
            ms(*nanos),
            *calls as f64 / per,
            rate
        );
    }
    let _ = writeln!(
        out,
        "\nby step (node ids are the IR's: `graph().to_text()`):"
    );
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>8} {:>8}  {:<16} {:>5}  what",
        "share", "ms", "calls", "GFLOP/s", "kind", "node"
    );
    for ((_, _, kind, node), e) in &rows {
        let _ = writeln!(
            out,
            "{:>5.1}% {:>10.3} {:>8.0} {:>8}  {:<16} {:>5}  {}",
            share(e.nanos),
            ms(e.nanos),
            e.calls as f64 / per,
            gflops(e),
            kind,
            node,
            e.label
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_region_is_reported_with_its_calls() {
        set_enabled(true);
        reset();
        for _ in 0..3 {
            time("optimizer step", || {
                std::thread::sleep(Duration::from_millis(1))
            });
        }
        let text = report(1).unwrap_or_default();
        set_enabled(false);
        let line = text
            .lines()
            .find(|l| l.contains("optimizer step") && l.contains('%'))
            .unwrap_or_default();
        assert!(line.contains(" 3 "), "{text}");
    }
}
