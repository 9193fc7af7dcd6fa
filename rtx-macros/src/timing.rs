//! Where a model's expansion spends its time, printed with `RTX_EXPANSION_TIME`: the phases
//! of the compiler (lowering with shape checks, autodiff, dead-code removal, egg rewrites,
//! code generation), summed over the model's graph functions.

use std::cell::RefCell;
use std::time::{Duration, Instant};

thread_local! {
    static PHASES: RefCell<Vec<(&'static str, Duration)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f`, adding its wall time to `phase`.
pub fn phase<T>(phase: &'static str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    let took = started.elapsed();
    PHASES.with(|p| {
        let mut p = p.borrow_mut();
        match p.iter_mut().find(|(name, _)| *name == phase) {
            Some((_, total)) => *total += took,
            None => p.push((phase, took)),
        }
    });
    out
}

/// The phases timed since the last call, as `lower 12.0 ms, autodiff 1.1 ms, ...`; resets.
pub fn take_summary() -> String {
    PHASES.with(|p| {
        std::mem::take(&mut *p.borrow_mut())
            .iter()
            .map(|(name, d)| format!("{name} {:.1} ms", d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    })
}
