//! Where a compiled function runs: on the caller's thread, or, when it has enough work for
//! its kernels to split across threads, on a thread of rayon's pool with the other threads
//! kept awake.
//!
//! A kernel that forks from a thread outside the pool hands its work to the pool and sleeps
//! until it is done: two context switches per kernel, tens of microseconds on a busy machine,
//! more than many kernels of a training step take. Running the whole function on a pool
//! thread pays that once per call, and each kernel then forks with a cheap `join`. A join
//! still has to wake a worker that went to sleep between two kernels, which on a virtual
//! machine takes as long as a small GEMM; so for the length of the call every other worker
//! runs a loop that takes pending work as soon as it appears (`rayon::yield_now`) instead of
//! sleeping, as OpenMP runtimes spin between parallel regions. Small calls (a batch-1 forward
//! pass) have no kernel that forks, so they stay where they are.

use std::sync::atomic::{AtomicBool, Ordering};

/// Elements in the largest value of a call below which it runs on the caller's thread; the
/// kernels' own threshold for splitting work is the same size.
const POOL_WORK: usize = 32 * 1024;

/// Runs `f`, on a pool thread when `largest` (elements in the function's largest value for
/// this call) is large enough for its kernels to go parallel and the caller is not already a
/// pool thread.
#[doc(hidden)]
pub fn run<R: Send>(largest: usize, f: impl FnOnce() -> R + Send) -> R {
    if largest < POOL_WORK || rayon::current_thread_index().is_some() {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|_| {
        let caller = rayon::current_thread_index();
        let others = rayon::current_num_threads().saturating_sub(1);
        // `join`, not `spawn`: its jobs live on the stack, so a call allocates nothing.
        let (result, ()) = rayon::join(
            || {
                // Set even if `f` unwinds, so the other workers stop and the panic surfaces.
                let _stop = SetOnDrop(&done);
                f()
            },
            || keep_awake(others, caller, &done),
        );
        result
    })
}

/// Sets the flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Keeps `count` workers other than `caller` taking work until `done`: this thread runs one
/// loop and leaves the rest to whichever worker steals it.
fn keep_awake(count: usize, caller: Option<usize>, done: &AtomicBool) {
    if count == 0 {
        return;
    }
    rayon::join(
        || stay_awake(caller, done),
        || keep_awake(count - 1, caller, done),
    );
}

/// Takes the pool's pending work as it appears until `done`. Returns at once on the calling
/// function's own thread, which may pick this job up while it waits inside a kernel: staying
/// there would keep the function from finishing. Yields the core to the OS when there is
/// nothing to take, so a machine with fewer cores than threads still progresses.
fn stay_awake(caller: Option<usize>, done: &AtomicBool) {
    if rayon::current_thread_index() == caller {
        return;
    }
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
        } else {
            idle += 1;
            if idle.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                // Looking for work touches the pool's shared queues: between looks, wait a
                // few hundred cycles so the working thread keeps those cache lines.
                for _ in 0..8 {
                    std::hint::spin_loop();
                }
            }
        }
    }
}
