//! A training step allocates no memory after the first: kernel outputs come from the buffer
//! cache, tensor handles and gradient lists are reused, layouts live inline, and the GEMM's
//! packing buffers are kept per thread.
//!
//! The global allocator of this test binary counts the allocations made on the threads of the
//! rayon pool that runs the scenario (the harness's own threads, or a pool shutting down,
//! are not the model's doing). The scenarios run in one test function, one after another.

mod common;

use common::Rng;
use models::cnn::Cnn;
use models::mlp::Mlp;
use rtx_core::optim::{AdamW, Optimizer, Sgd};
use rtx_core::{Ctx, Module, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted: set on the threads of the pools below.
    static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(|c| c.get()).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Allocations made by each of `steps` calls of `step`.
fn allocations_per_step(steps: usize, mut step: impl FnMut()) -> Vec<usize> {
    (0..steps)
        .map(|_| {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            step();
            ALLOCATIONS.load(Ordering::SeqCst) - before
        })
        .collect()
}

fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(|_| COUNTED.with(|c| c.set(true)))
        .exit_handler(|_| COUNTED.with(|c| c.set(false)))
        .build()
        .unwrap();
    register_for_stealing(&pool);
    pool.install(f)
}

/// Has every worker of `pool` look for work to steal once: a rayon worker's first steal
/// registers it with crossbeam's epoch collector, a one-time allocation of rayon's, made at
/// whichever step that worker first steals (scheduling decides), not the model's doing. A
/// pool's threads stop being counted when they exit (`exit_handler`): an exiting thread's
/// epoch state is freed then, while a later scenario may be counting.
fn register_for_stealing(pool: &rayon::ThreadPool) {
    pool.broadcast(|_| {
        let _ = rayon::yield_now();
    });
}

fn mlp_steps(steps: usize, batch: usize) -> Vec<usize> {
    let mut model = Mlp::init(1);
    let mut rng = Rng::new(1);
    let (x, y) = (rng.images(&[batch, 64]), rng.labels(batch));
    let mut optimizer = AdamW::new(1e-3);
    let mut ctx = Ctx::train(1);
    allocations_per_step(steps, || {
        let (_, grads) = model.loss_and_grads(&mut ctx, &x, &y).unwrap();
        optimizer.step(&mut model, &grads).unwrap();
    })
}

fn cnn_steps(steps: usize, batch: usize) -> Vec<usize> {
    let mut model = Cnn::init(2);
    let mut rng = Rng::new(2);
    let (x, y) = (rng.images(&[batch, 1, 8, 8]), rng.labels(batch));
    let mut optimizer = Sgd::new(0.05).momentum(0.9).nesterov(true);
    let mut ctx = Ctx::train(2);
    allocations_per_step(steps, || {
        let (_, grads) = model.loss_and_grads(&mut ctx, &x, &y).unwrap();
        optimizer.step(&mut model, &grads).unwrap();
    })
}

/// GPT training steps on random token windows: four blocks keep more than a dozen
/// `[B, T, 128]` activations alive at once, more buffers of one size than the smaller models.
fn gpt_steps(steps: usize, batch: usize) -> Vec<usize> {
    use models::gpt::{CONTEXT, Gpt};
    let mut model = Gpt::init(4);
    let mut rng = Rng::new(4);
    let mut ids = || {
        let ids = (0..batch * CONTEXT)
            .map(|_| rng.below(models::corpus::VOCAB) as i64)
            .collect();
        Tensor::from_i64(ids, &[batch, CONTEXT]).unwrap()
    };
    let (x, y) = (ids(), ids());
    let mut optimizer = AdamW::new(1e-3);
    let mut ctx = Ctx::train(4);
    allocations_per_step(steps, || {
        let (_, grads) = model.loss_and_grads(&mut ctx, &x, &y).unwrap();
        optimizer.step(&mut model, &grads).unwrap();
    })
}

fn mlp_forward(steps: usize, batch: usize) -> Vec<usize> {
    let model = Mlp::init(3);
    let x: Tensor = Rng::new(3).images(&[batch, 64]);
    allocations_per_step(steps, || {
        let logits = model.forward(&x).unwrap();
        assert_eq!(logits.shape(), &[batch, 10]);
    })
}

#[test]
fn training_steps_and_forward_passes_allocate_nothing_after_warm_up() {
    // On one thread every kernel runs on the same thread, so the first step warms everything.
    let single = on_threads(1, || {
        [
            ("mlp step b=256", mlp_steps(4, 256)),
            ("cnn step b=32", cnn_steps(4, 32)),
            ("gpt step b=2", gpt_steps(4, 2)),
            ("mlp forward b=1", mlp_forward(4, 1)),
            ("mlp forward b=256", mlp_forward(4, 256)),
        ]
    });
    // The first step of all warms the caches, so the counter must see it.
    assert!(
        single[0].1[0] > 0,
        "the first step allocates: {:?}",
        single[0]
    );
    for (what, counts) in &single {
        assert!(
            counts[1..].iter().all(|&n| n == 0),
            "{what}: allocations per step on 1 thread: {counts:?}"
        );
    }

    // On two threads a worker keeps its packing buffer from the first GEMM task it runs, so
    // which step warms it depends on scheduling: count from the third step.
    let two = on_threads(2, || {
        [
            ("mlp step b=600", mlp_steps(6, 600)),
            ("cnn step b=128", cnn_steps(6, 128)),
            ("gpt step b=4", gpt_steps(6, 4)),
        ]
    });
    for (what, counts) in &two {
        assert!(
            counts[3..].iter().all(|&n| n == 0),
            "{what}: allocations per step on 2 threads: {counts:?}"
        );
    }

    // Called from a thread outside any pool, as a training loop does: the call moves to the
    // global pool and keeps its other worker awake (`rtx_core::parallel`), which must not
    // allocate either. The global pool's threads are counted.
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .start_handler(|_| COUNTED.with(|c| c.set(true)))
        .exit_handler(|_| COUNTED.with(|c| c.set(false)))
        .build_global()
        .unwrap();
    rayon::broadcast(|_| {
        let _ = rayon::yield_now();
    });
    // Which worker runs each call, and which tasks it steals, varies from call to call: the
    // first steps warm both workers' roles, so the count starts at the fifth.
    for (what, counts) in [
        ("mlp step b=256 from outside the pool", mlp_steps(8, 256)),
        ("cnn step b=128 from outside the pool", cnn_steps(8, 128)),
        ("gpt step b=4 from outside the pool", gpt_steps(8, 4)),
    ] {
        assert!(
            counts[4..].iter().all(|&n| n == 0),
            "{what}: allocations per step: {counts:?}"
        );
    }
}
