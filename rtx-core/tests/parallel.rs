//! `parallel::run`: a compiled call moved onto rayon's pool returns its result, its parallel
//! work completes, and a panic inside it comes back to the caller instead of hanging the
//! workers it kept awake.

use rayon::prelude::*;
use rtx_core::parallel::run;

#[test]
fn a_large_call_runs_its_parallel_work_and_returns_the_result() {
    let total: u64 = run(usize::MAX, || {
        (0..100_000u64).into_par_iter().map(|v| v * 2).sum()
    });
    assert_eq!(total, 100_000 * 99_999);
}

#[test]
fn a_small_call_runs_on_the_callers_thread() {
    let caller = std::thread::current().id();
    let ran_on = run(10, || std::thread::current().id());
    assert_eq!(ran_on, caller);
}

#[test]
fn a_panic_inside_the_call_reaches_the_caller() {
    let outcome = std::panic::catch_unwind(|| {
        run(usize::MAX, || -> u32 {
            let _: u64 = (0..1000u64).into_par_iter().sum();
            panic!("inside the compiled call")
        })
    });
    assert!(outcome.is_err());
    // The pool still works afterwards.
    assert_eq!(run(usize::MAX, || 7), 7);
}
