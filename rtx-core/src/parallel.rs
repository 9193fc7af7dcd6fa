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

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Elements in the largest value of a call below which it runs on the caller's thread; the
/// kernels' own threshold for splitting work is the same size.
const POOL_WORK: usize = 32 * 1024;

/// Runs `f`, on a pool thread when `largest` (elements in the function's largest value for
/// this call) is large enough for its kernels to go parallel and the caller is not already a
/// pool thread.
#[doc(hidden)]
pub fn run<R: Send>(largest: usize, f: impl FnOnce() -> R + Send) -> R {
    // Before the size test: a small call's kernels may still fork (a GEMM of 2^20
    // multiply-adds has only 16K outputs), and with the main thread outside the pool each
    // fork would hand its work over and wait (a batch-128 MLP forward pass: 115 µs instead
    // of 60).
    join_pool_from_main();
    if largest < POOL_WORK {
        return f();
    }
    if rayon::current_thread_index().is_some() {
        // Only the main thread sets `IN_CALL_ON_MAIN`: set already, this call is nested.
        if !TEAM_LEAD.with(Cell::get) || IN_CALL_ON_MAIN.swap(true, Ordering::AcqRel) {
            return f();
        }
        // The main thread is worker 0 of the pool: run here, with the other workers
        // lingering (taking work as it appears) from now until `LINGER` after the call.
        let _leave = LeaveCall;
        touch();
        start_lingering();
        let result = f();
        touch();
        return result;
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

thread_local! {
    /// Whether this thread is the main thread and worker 0 of the global pool.
    static TEAM_LEAD: Cell<bool> = const { Cell::new(false) };
}

/// Clears `IN_CALL_ON_MAIN` when dropped, also if the call unwinds.
struct LeaveCall;

impl Drop for LeaveCall {
    fn drop(&mut self) {
        IN_CALL_ON_MAIN.store(false, Ordering::Release);
    }
}

/// Makes the program's main thread worker 0 of rayon's global pool, as OpenMP makes the
/// master thread a member of the team, if the pool does not exist yet: then a call from it
/// runs where it is, with no hand-off to a worker and no wake-up of the caller when it is
/// done (each costs tens of microseconds on these VMs, more than the kernels of a small
/// training step). Only the thread named `main`: a pool member that exits (a test's thread,
/// a request handler) would leave its part of the pool unserved. When something built the
/// pool first, calls hand off as before. Every large `run` tries it; a program that uses
/// rayon itself before its first compiled call should call this first thing in `main`.
/// Not for a pool of one thread: the main thread would then be the pool, and work it spawns
/// and then blocks on outside rayon (a channel's `recv`) would never run.
pub fn join_pool_from_main() {
    static TRIED: std::sync::Once = std::sync::Once::new();
    if TRIED.is_completed() || std::thread::current().name() != Some("main") {
        return;
    }
    TRIED.call_once(|| {
        // rayon's own default: RAYON_NUM_THREADS when set and nonzero, else the CPU count.
        let threads = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1);
        let built = threads >= 2
            && rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .use_current_thread()
                .build_global()
                .is_ok();
        TEAM_LEAD.with(|t| t.set(built));
    });
}

/// How long the other workers keep taking work after a call from the main thread before
/// they sleep: a training loop calls again within milliseconds (OpenMP runtimes spin for
/// 0.2 ms to 200 ms between parallel regions).
const LINGER: Duration = Duration::from_millis(5);

/// Workers now in `linger`.
static LINGERING: AtomicUsize = AtomicUsize::new(0);
/// Whether lingering workers were asked for and have not all started.
static STARTING: AtomicBool = AtomicBool::new(false);
/// Nanoseconds since `EPOCH` of the latest start or end of a call from the main thread.
static LAST_CALL: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn touch() {
    LAST_CALL.store(now_ns(), Ordering::Release);
}

/// Asks every other worker to linger unless they do (or are about to). A broadcast, not a
/// spawn: a spawned job sits on the main thread's own queue, where the main thread may take
/// it back itself and no worker starts lingering. `spawn_broadcast` allocates its job, so
/// this allocates only when the workers had stopped after `LINGER` without calls.
fn start_lingering() {
    let others = rayon::current_num_threads().saturating_sub(1);
    if LINGERING.load(Ordering::Acquire) >= others || STARTING.swap(true, Ordering::AcqRel) {
        return;
    }
    rayon::spawn_broadcast(|context| {
        if context.index() != 0 {
            linger();
        }
    });
}

thread_local! {
    static IN_LINGER: Cell<bool> = const { Cell::new(false) };
}

/// Takes the pool's work as it appears until `LINGER` has passed since the last call, as
/// `stay_awake` does within one call.
fn linger() {
    // A worker already lingering may pick up a second request while polling.
    if TEAM_LEAD.with(Cell::get) || IN_LINGER.with(|l| l.replace(true)) {
        return;
    }
    let others = rayon::current_num_threads().saturating_sub(1);
    if LINGERING.fetch_add(1, Ordering::AcqRel) + 1 >= others {
        STARTING.store(false, Ordering::Release);
    }
    let linger_ns = LINGER.as_nanos() as u64;
    let mut idle = 0u32;
    loop {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
            continue;
        }
        idle += 1;
        if !idle.is_multiple_of(64) {
            for _ in 0..8 {
                std::hint::spin_loop();
            }
            continue;
        }
        let call_running = IN_CALL_ON_MAIN.load(Ordering::Acquire);
        if !call_running && now_ns().saturating_sub(LAST_CALL.load(Ordering::Acquire)) > linger_ns {
            break;
        }
        std::thread::yield_now();
    }
    LINGERING.fetch_sub(1, Ordering::AcqRel);
    IN_LINGER.with(|l| l.set(false));
}

/// How many workers are lingering now (for tests).
#[doc(hidden)]
pub fn lingering_workers() -> usize {
    LINGERING.load(Ordering::Acquire)
}

/// Whether the main thread is inside a call: nested calls run inline, and a long call keeps
/// the workers lingering.
static IN_CALL_ON_MAIN: AtomicBool = AtomicBool::new(false);

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
