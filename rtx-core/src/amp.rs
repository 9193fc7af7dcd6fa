//! Dynamic loss scaling for f16 training, as PyTorch's `torch.amp.GradScaler`.
//!
//! f16's smallest normal value is 2^-14 and its largest 65504: rounded to f16, small
//! gradients flush to zero. Scaling the loss by `S` (a power of two) lifts every gradient by
//! `S` before it is rounded; `S` is halved when a gradient overflows (that step is skipped)
//! and doubled after a run of steps without overflow. The compiled code applies the scale
//! where gradients are rounded (`Ctx::set_loss_scale`, `Op::AutocastGrad`) and returns them
//! unscaled, so the scaler only sets the scale before a step and checks the gradients after.
//!
//! ```no_run
//! # use rtx_core::prelude::*;
//! # use rtx_core::amp::LossScaler;
//! # fn step<M: Model>(model: &mut M, opt: &mut AdamW, x: &Tensor, y: &Tensor) -> rtx_core::Result<()> {
//! let mut scaler = LossScaler::new();
//! let mut ctx = Ctx::train(0).with_precision(rtx_core::Precision::F16);
//! scaler.prepare(&mut ctx)?;
//! let (loss, grads) = model.loss_and_grads(&mut ctx, x, y)?;
//! if scaler.update(&grads)? {
//!     opt.step(model, &grads)?;
//! }
//! # Ok(()) }
//! ```

use crate::ctx::Ctx;
use crate::error::{Result, RtxError};
use crate::module::Grads;

/// The smallest scale the scaler backs off to: below it a run whose gradients overflow at
/// every scale (a forward pass that already overflows f16) would only lose precision.
const MIN_SCALE: f32 = 1.0 / 16_777_216.0; // 2^-24

/// The loss scale and its history. `Clone` and its fields' accessors let a training
/// checkpoint save and restore it.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    scale: f32,
    growth_interval: u32,
    good_steps: u32,
    skipped: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler::new()
    }
}

fn check_power_of_two(what: &str, v: f32) -> Result<()> {
    if v.is_normal() && v > 0.0 && v.to_bits() & 0x007F_FFFF == 0 {
        Ok(())
    } else {
        Err(RtxError::Invalid(format!(
            "{what} must be a positive power of two (scaling must be exact), found {v}"
        )))
    }
}

impl LossScaler {
    /// PyTorch's defaults: scale 2^16, doubled after 2000 steps in a row without overflow,
    /// halved at every overflow.
    pub fn new() -> LossScaler {
        LossScaler {
            scale: 65_536.0,
            growth_interval: 2000,
            good_steps: 0,
            skipped: 0,
        }
    }

    /// Starts from `scale` (a positive power of two).
    pub fn with_initial_scale(mut self, scale: f32) -> Result<LossScaler> {
        check_power_of_two("the initial loss scale", scale)?;
        self.scale = scale;
        Ok(self)
    }

    /// Doubles the scale after `steps` steps in a row without overflow (at least 1).
    pub fn with_growth_interval(mut self, steps: u32) -> Result<LossScaler> {
        if steps == 0 {
            return Err(RtxError::Invalid(
                "the loss scale's growth interval must be at least 1 step, found 0".into(),
            ));
        }
        self.growth_interval = steps;
        Ok(self)
    }

    /// The scale the next step runs at.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Steps skipped so far because a gradient overflowed.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    /// Steps in a row without overflow since the scale last changed.
    pub fn good_steps(&self) -> u32 {
        self.good_steps
    }

    /// Puts the current scale into the context of the next forward and backward call.
    pub fn prepare(&self, ctx: &mut Ctx) -> Result<()> {
        ctx.set_loss_scale(self.scale)
    }

    /// After the backward pass: whether every gradient is finite (take the optimizer step)
    /// or not (skip it, counted in `skipped_steps`), and the scale for the next step.
    pub fn update(&mut self, grads: &Grads) -> Result<bool> {
        let mut finite = true;
        for (_, g) in grads.iter() {
            if !g.device().is_cpu() {
                // On a device: `g * 0` is NaN exactly where `g` is not finite, and its sum
                // is one value to read back.
                let zero = crate::Tensor::scalar(0.0).to(&g.device())?;
                let all = rtx_ir::Op::Sum {
                    axes: (0..g.rank()).collect(),
                    keepdim: false,
                };
                let probe = g.mul(&zero)?;
                let sum = crate::ops::run_op(&all, &[&probe], &mut crate::Ctx::eval())?;
                if !sum.item()?.is_finite() {
                    finite = false;
                    break;
                }
                continue;
            }
            if !g.f32_contiguous()?.iter().all(|v| v.is_finite()) {
                finite = false;
                break;
            }
        }
        if finite {
            self.good_steps += 1;
            if self.good_steps >= self.growth_interval {
                // f32 cannot hold a scale past 2^127; a scale that large never helps anyway.
                if self.scale < 2f32.powi(100) {
                    self.scale *= 2.0;
                }
                self.good_steps = 0;
            }
        } else {
            self.skipped += 1;
            self.good_steps = 0;
            self.scale = (self.scale * 0.5).max(MIN_SCALE);
        }
        Ok(finite)
    }

    /// The saved state: scale, steps without overflow, skipped steps (training checkpoints).
    pub fn state(&self) -> (f32, u32, u64) {
        (self.scale, self.good_steps, self.skipped)
    }

    /// Restores a state from `state`.
    pub fn set_state(&mut self, scale: f32, good_steps: u32, skipped: u64) -> Result<()> {
        check_power_of_two("a saved loss scale", scale)?;
        self.scale = scale;
        self.good_steps = good_steps;
        self.skipped = skipped;
        Ok(())
    }
}
