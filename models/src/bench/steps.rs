//! The benchmarks of whole models: training steps and forward passes.

use super::{Line, Plan, measure, normal_vec};
use crate::bench_models::WideMlp;
use crate::cnn::Cnn;
use crate::mlp::Mlp;
use rtx_core::prelude::*;
use std::hint::black_box;

/// A random f32 tensor of `shape` and, for classifiers, `batch` labels in 0..10.
pub(super) fn random_batch(seed: u64, shape: &[usize]) -> Result<(Tensor, Tensor)> {
    let mut rng = Rng::new(seed);
    let numel = shape.iter().product();
    let x = Tensor::from_vec(normal_vec(&mut rng, numel), shape)?;
    let batch = shape.first().copied().unwrap_or(1);
    let labels = (0..batch).map(|_| rng.below(10) as i64).collect();
    let y = Tensor::from_i64(labels, &[batch])?;
    Ok((x, y))
}

/// Signature shared by the generated `loss_and_grads` of the classifiers benchmarked here.
type LossAndGrads<M> = fn(&M, &mut Ctx, &Tensor, &Tensor) -> Result<(Tensor, Grads)>;

/// One training step as `models train` runs it: compiled forward + backward (dropout on,
/// `Ctx::train`), then an AdamW update of every parameter.
fn train_step<M: Module>(
    name: &'static str,
    model: M,
    loss_and_grads: LossAndGrads<M>,
    input_shape: &[usize],
    plan: Plan,
) -> Result<()> {
    train_step_with(name, model, loss_and_grads, input_shape, plan, true)
}

/// `train_step` with fusion on or off (`Ctx::with_fusion`), to show what fusion buys.
fn train_step_with<M: Module>(
    name: &'static str,
    mut model: M,
    loss_and_grads: LossAndGrads<M>,
    input_shape: &[usize],
    plan: Plan,
    fused: bool,
) -> Result<()> {
    let (x, y) = random_batch(1, input_shape)?;
    let mut opt = AdamW::new(1e-3);
    let mut ctx = Ctx::train(0).with_fusion(fused);
    let timing = measure(plan, || {
        let (loss, grads) = loss_and_grads(&model, &mut ctx, &x, &y)?;
        opt.step(&mut model, &grads)?;
        black_box(loss);
        Ok(())
    })?;
    let batch = input_shape.first().copied().unwrap_or(1);
    println!("{}", Line::new(name).field("batch", batch).timing(&timing));
    Ok(())
}

pub(super) fn mlp_step_small() -> Result<()> {
    let plan = Plan::new(20, 300, 3_000);
    for (name, fused) in [
        ("mlp_step_64_128_10", true),
        ("mlp_step_64_128_10_unfused", false),
    ] {
        train_step_with(
            name,
            Mlp::init(0),
            Mlp::loss_and_grads,
            &[256, 64],
            plan,
            fused,
        )?;
    }
    Ok(())
}

pub(super) fn mlp_step_wide() -> Result<()> {
    let plan = Plan::new(3, 50, 5_000);
    for (name, fused) in [
        ("mlp_step_64_1024_1024_10", true),
        ("mlp_step_64_1024_1024_10_unfused", false),
    ] {
        train_step_with(
            name,
            WideMlp::init(0),
            WideMlp::loss_and_grads,
            &[256, 64],
            plan,
            fused,
        )?;
    }
    Ok(())
}

pub(super) fn cnn_step() -> Result<()> {
    train_step(
        "cnn_step",
        Cnn::init(0),
        Cnn::loss_and_grads,
        &[32, 1, 8, 8],
        Plan::new(10, 300, 3_000),
    )
}

/// Inference (`forward`, eval mode: dropout is the identity) at batch 1, where per-op
/// overhead dominates, and at batch 256.
pub(super) fn mlp_forward() -> Result<()> {
    let model = Mlp::init(0);
    for batch in [1, 256] {
        let (x, _) = random_batch(2, &[batch, 64])?;
        let timing = measure(Plan::new(50, 2_000, 2_000), || {
            black_box(model.forward(&x)?);
            Ok(())
        })?;
        println!(
            "{}",
            Line::new("mlp_forward")
                .field("batch", batch)
                .timing(&timing)
        );
    }
    Ok(())
}

/// One GPT training step (`models::gpt`, 4 layers, width 128, context 64) at batch 32 on
/// random token ids: compiled forward and backward, gradient clipping at norm 1 and an AdamW
/// update, as `models train --model gpt` runs it. Also prints tokens per second.
pub(super) fn gpt_step() -> Result<()> {
    use crate::gpt::{CONTEXT, Gpt};
    use rtx_core::profile;
    use rtx_core::schedule::clip_grad_norm;
    let plan = Plan::new(3, 30, 6_000);
    let batch = 32;
    let mut rng = Rng::new(3);
    let ids: Vec<i64> = (0..batch * (CONTEXT + 1))
        .map(|_| rng.below(crate::corpus::VOCAB) as i64)
        .collect();
    let x: Vec<i64> = ids
        .chunks(CONTEXT + 1)
        .flat_map(|w| w[..CONTEXT].to_vec())
        .collect();
    let y: Vec<i64> = ids
        .chunks(CONTEXT + 1)
        .flat_map(|w| w[1..].to_vec())
        .collect();
    let x = Tensor::from_i64(x, &[batch, CONTEXT])?;
    let y = Tensor::from_i64(y, &[batch, CONTEXT])?;
    let mut model = Gpt::init(0);
    let mut opt = AdamW::new(1e-3).weight_decay(0.1).betas(0.9, 0.99);
    let mut ctx = Ctx::train(0);
    let timing = measure(plan, || {
        let (loss, mut grads) = model.loss_and_grads(&mut ctx, &x, &y)?;
        profile::time("clip_grad_norm", || clip_grad_norm(&mut grads, 1.0))?;
        profile::time("optimizer step", || opt.step(&mut model, &grads))?;
        black_box(loss);
        Ok(())
    })?;
    let tokens_per_s = (batch * CONTEXT) as f64 / (timing.median_us() * 1e-6);
    println!(
        "{}",
        Line::new("gpt_step")
            .field("batch", batch)
            .timing(&timing)
            .field("tokens_per_s", format!("{tokens_per_s:.0}"))
    );
    Ok(())
}
