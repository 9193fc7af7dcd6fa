//! Generic training: the [`Model`] trait that `#[model]` implements for every model whose
//! graph has `forward(x)` and a scalar `loss(x, y)`, and the pieces of a loop that work for
//! any such model ([`train_step`], [`mean_loss`]), so training code is written once, not per
//! model. Schedules and clipping are in `schedule.rs`, batching in `batches.rs`.

use crate::amp::LossScaler;
use crate::ctx::Ctx;
use crate::error::{Result, RtxError};
use crate::module::{Grads, Module};
use crate::optim::Optimizer;
use crate::schedule::clip_grad_norm;
use crate::tensor::Tensor;

/// A model that can be trained on `(input, target)` batches. `#[model]` implements it from
/// the graph functions `forward` (one input) and `loss` (an input and a target, scalar
/// result); the methods are those compiled functions.
pub trait Model: Module {
    /// The graph function `forward`, in evaluation mode.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// The graph function `loss`, in evaluation mode.
    fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor>;
    /// `loss` and the gradient of every parameter (`ctx` decides train or eval mode).
    fn loss_and_grads(&self, ctx: &mut Ctx, x: &Tensor, y: &Tensor) -> Result<(Tensor, Grads)>;
}

/// One optimizer step on `(x, y)` at learning rate `lr`: loss and gradients, clipping to a
/// global norm of `clip` when given, and the update. Returns the loss. A loss that is not
/// finite is an error naming it, and the parameters are left as they were.
pub fn train_step<M: Model, O: Optimizer>(
    model: &mut M,
    optimizer: &mut O,
    ctx: &mut Ctx,
    (x, y): (&Tensor, &Tensor),
    lr: f32,
    clip: Option<f32>,
) -> Result<f32> {
    let (loss, mut grads) = model.loss_and_grads(ctx, x, y)?;
    let loss = loss.item()?;
    if !loss.is_finite() {
        return Err(RtxError::Invalid(format!(
            "the training loss is {loss}: the parameters were not updated (lower the learning rate, or clip the gradients)"
        )));
    }
    if let Some(max_norm) = clip {
        crate::profile::time("clip_grad_norm", || clip_grad_norm(&mut grads, max_norm))?;
    }
    optimizer.set_lr(lr);
    crate::profile::time("optimizer step", || optimizer.step(model, &grads))?;
    Ok(loss)
}

/// One mixed-precision step: [`train_step`] with the loss scale of `scaler` (set in `ctx`
/// before the pass, updated after). Returns the loss and whether the step was taken: a step
/// whose gradients overflowed the scale is skipped (the parameters and the optimizer state
/// are unchanged, `scaler.skipped_steps()` counts it) and the scale halves. A loss that is
/// not finite is still an error: the forward pass overflowed, which no loss scale repairs.
pub fn train_step_scaled<M: Model, O: Optimizer>(
    model: &mut M,
    optimizer: &mut O,
    ctx: &mut Ctx,
    (x, y): (&Tensor, &Tensor),
    lr: f32,
    clip: Option<f32>,
    scaler: &mut LossScaler,
) -> Result<(f32, bool)> {
    scaler.prepare(ctx)?;
    let (loss, mut grads) = model.loss_and_grads(ctx, x, y)?;
    let loss = loss.item()?;
    if !loss.is_finite() {
        return Err(RtxError::Invalid(format!(
            "the training loss is {loss} at {} precision: the parameters were not updated (an f16 forward pass past 65504 overflows; try bf16, or a lower learning rate)",
            ctx.precision().name()
        )));
    }
    if !scaler.update(&grads)? {
        return Ok((loss, false));
    }
    if let Some(max_norm) = clip {
        crate::profile::time("clip_grad_norm", || clip_grad_norm(&mut grads, max_norm))?;
    }
    optimizer.set_lr(lr);
    crate::profile::time("optimizer step", || optimizer.step(model, &grads))?;
    Ok((loss, true))
}

/// The mean of `loss` over `batches` in evaluation mode, each batch weighted by its number of
/// examples (its first axis), so a smaller last batch counts for what it holds.
pub fn mean_loss<'a, M: Model>(
    model: &M,
    batches: impl IntoIterator<Item = &'a (Tensor, Tensor)>,
) -> Result<f32> {
    let (mut total, mut count) = (0.0f64, 0usize);
    for (x, y) in batches {
        let n = x.shape().first().copied().unwrap_or(1);
        total += f64::from(model.loss(x, y)?.item()?) * n as f64;
        count += n;
    }
    if count == 0 {
        return Err(RtxError::Invalid(
            "mean_loss needs at least one batch, found none".into(),
        ));
    }
    Ok((total / count as f64) as f32)
}
