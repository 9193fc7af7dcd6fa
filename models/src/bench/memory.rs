//! What a training step holds in memory: the liveness plan's figures for each model
//! (`rtx_ir::memory::MemoryReport`) next to what the runtime's buffer cache actually
//! allocated over the first steps of the same model.

use super::Line;
use crate::bench_models::WideMlp;
use crate::cnn::Cnn;
use crate::gpt::{CONTEXT, Gpt};
use crate::mlp::Mlp;
use rtx_core::ir::ModelIr;
use rtx_core::prelude::*;

const MIB: f64 = (1u64 << 20) as f64;

/// Three compiled training steps (forward, backward, AdamW) of `model`.
fn run_steps<M: Module>(
    mut model: M,
    loss_and_grads: impl Fn(&M, &mut Ctx) -> Result<(Tensor, Grads)>,
) -> Result<()> {
    let mut opt = AdamW::new(1e-3);
    let mut ctx = Ctx::train(0);
    for _ in 0..3 {
        let (_, grads) = loss_and_grads(&model, &mut ctx)?;
        opt.step(&mut model, &grads)?;
    }
    Ok(())
}

fn report(
    name: &str,
    ir: Result<ModelIr>,
    symbols: &[(&str, usize)],
    steps: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let ir = ir?;
    let loss = ir
        .function("loss")
        .ok_or_else(|| RtxError::Invalid(format!("model {name} has no `loss` function")))?;
    let plan = loss.memory_report(symbols).ok_or_else(|| {
        RtxError::Invalid(format!(
            "model {name}: a dimension has no value in {symbols:?}"
        ))
    })?;
    let dims: Vec<(&str, i64)> = symbols.iter().map(|&(n, v)| (n, v as i64)).collect();
    let planned =
        rtx_core::planned::arena_bytes(loss, loss.graph.len(), &loss.roots(), &dims).unwrap_or(0);
    let before = rtx_backends::pool::allocated_bytes();
    let fallbacks = rtx_backends::arena::fallbacks();
    steps()?;
    let allocated = rtx_backends::pool::allocated_bytes() - before;
    let fallbacks = rtx_backends::arena::fallbacks() - fallbacks;
    let mib = |b: u128| format!("{:.2}", b as f64 / MIB);
    println!(
        "{}",
        Line::new("memory")
            .field("model", name)
            .field("peak_mib", mib(plan.peak_bytes))
            .field("arena_mib", mib(plan.arena_bytes))
            .field("cache_mib", mib(plan.cache_bytes))
            .field("all_values_mib", mib(plan.total_bytes))
            .field("call_arena_mib", mib(planned))
            .field("allocated_mib", mib(u128::from(allocated)))
            .field("arena_fallbacks", fallbacks)
    );
    Ok(())
}

/// `bench=memory` lines: for each model's training step, the peak of live intermediates,
/// what one arena with fixed offsets would need, what an exact-size buffer cache holds, the
/// sum of all intermediates, the arena the runtime lays out for the call (the intermediates
/// its fused kernels write, not the results, which come from the buffer cache), what the
/// arena and the buffer cache allocated over three steps (buffers of the same size as an
/// earlier model's are reused, so later models can read low), and how often a planned
/// buffer was still occupied (`rtx_backends::arena::fallbacks`, zero when the run follows
/// the plan).
pub(super) fn memory() -> Result<()> {
    let (x, y) = super::steps::random_batch(1, &[256, 64])?;
    report("mlp_64_128_10", Mlp::graph(), &[("B", 256)], || {
        run_steps(Mlp::init(0), |m, c| m.loss_and_grads(c, &x, &y))
    })?;
    report(
        "mlp_64_1024_1024_10",
        WideMlp::graph(),
        &[("B", 256)],
        || run_steps(WideMlp::init(0), |m, c| m.loss_and_grads(c, &x, &y)),
    )?;
    let (x, y) = super::steps::random_batch(1, &[32, 1, 8, 8])?;
    report("cnn", Cnn::graph(), &[("B", 32)], || {
        run_steps(Cnn::init(0), |m, c| m.loss_and_grads(c, &x, &y))
    })?;
    let batch = 32;
    let mut rng = Rng::new(3);
    let ids = |rng: &mut Rng| -> Vec<i64> {
        (0..batch * CONTEXT)
            .map(|_| rng.below(crate::corpus::VOCAB) as i64)
            .collect()
    };
    let x = Tensor::from_i64(ids(&mut rng), &[batch, CONTEXT])?;
    let y = Tensor::from_i64(ids(&mut rng), &[batch, CONTEXT])?;
    report("gpt", Gpt::graph(), &[("B", batch), ("T", CONTEXT)], || {
        run_steps(Gpt::init(0), |m, c| m.loss_and_grads(c, &x, &y))
    })
}
