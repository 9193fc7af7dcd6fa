//! Where a compiled function runs: on the caller's thread, or, when it has enough work for
//! its kernels to split across threads, on a thread of rayon's pool.
//!
//! A kernel that forks from a thread outside the pool hands its work to the pool and sleeps
//! until it is done: two context switches per kernel, tens of microseconds on a busy machine,
//! more than many kernels of a training step take. Running the whole function on a pool
//! thread pays that once per call, and each kernel then forks with a cheap `join`. Small calls
//! (a batch-1 forward pass) have no kernel that forks, so they stay where they are.

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
    rayon::scope(|_| f())
}
