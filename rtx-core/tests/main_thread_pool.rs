//! `parallel::run` called from the program's main thread (this test has no harness, so its
//! `main` is the process's main thread): the thread becomes worker 0 of rayon's pool, calls
//! run where they are with the other workers lingering, results and panics come back, and the
//! workers stop lingering once calls stop.

use rayon::prelude::*;
use rtx_core::parallel::{join_pool_from_main, lingering_workers, run};
use std::time::{Duration, Instant};

fn main() {
    the_main_thread_becomes_worker_zero();
    a_call_returns_its_result_and_its_parallel_work_completes();
    nested_calls_run_inline();
    a_panic_inside_a_call_reaches_the_caller_and_the_pool_still_works();
    the_workers_stop_lingering_once_calls_stop();
    work_the_main_thread_spawns_and_waits_for_outside_rayon_still_runs();
    println!("main_thread_pool: 6 checks passed");
}

fn the_main_thread_becomes_worker_zero() {
    join_pool_from_main();
    if rayon::current_num_threads() >= 2 {
        assert_eq!(rayon::current_thread_index(), Some(0));
    } else {
        // A pool of one thread stays apart from the main thread.
        assert_eq!(rayon::current_thread_index(), None);
    }
}

fn a_call_returns_its_result_and_its_parallel_work_completes() {
    for _ in 0..50 {
        let total: u64 = run(usize::MAX, || {
            (0..200_000u64).into_par_iter().map(|v| v * 2).sum()
        });
        assert_eq!(total, 200_000 * 199_999);
    }
}

fn nested_calls_run_inline() {
    let inner = run(usize::MAX, || run(usize::MAX, rayon::current_thread_index));
    assert_eq!(inner, Some(0));
}

fn a_panic_inside_a_call_reaches_the_caller_and_the_pool_still_works() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(|| {
        run(usize::MAX, || -> u64 {
            let _: u64 = (0..1000u64).into_par_iter().sum();
            panic!("inside the compiled call")
        })
    });
    std::panic::set_hook(hook);
    assert!(outcome.is_err());
    assert_eq!(run(usize::MAX, || 7), 7);
    let again: u64 = run(usize::MAX, || (0..1000u64).into_par_iter().sum());
    assert_eq!(again, 499_500);
}

fn the_workers_stop_lingering_once_calls_stop() {
    let others = rayon::current_num_threads() - 1;
    // Calls keep the other workers lingering.
    let deadline = Instant::now() + Duration::from_secs(5);
    while lingering_workers() < others {
        run(usize::MAX, || ());
        assert!(
            Instant::now() < deadline,
            "the workers never started lingering"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while lingering_workers() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} workers still lingering 5 s after the last call",
            lingering_workers()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn work_the_main_thread_spawns_and_waits_for_outside_rayon_still_runs() {
    let (tx, rx) = std::sync::mpsc::channel();
    rayon::spawn(move || {
        let _ = tx.send(41 + 1);
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(42));
}
