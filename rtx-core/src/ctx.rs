//! Run-time context of a graph call: train or eval mode, the dropout seed stream, and the
//! precision products are computed at (mixed precision, with a loss scale for f16).

use crate::error::{Result, RtxError};
use crate::rng::Rng;
use rtx_backends::cpu::scalar::{HalfType, Rounding};
use rtx_ir::{AutocastMode, Precision};

#[derive(Clone, Debug)]
pub struct Ctx {
    pub train: bool,
    rng: Rng,
    fuse: bool,
    autocast: AutocastMode,
}

impl Ctx {
    /// Inference: dropout is the identity.
    pub fn eval() -> Ctx {
        Ctx {
            train: false,
            rng: Rng::new(0),
            fuse: crate::fused::fusion_enabled(),
            autocast: AutocastMode::OFF,
        }
    }

    /// Training: dropout masks come from a stream seeded with `seed`, so two runs with the
    /// same seed draw the same masks.
    pub fn train(seed: u64) -> Ctx {
        Ctx {
            train: true,
            rng: Rng::new(seed),
            fuse: crate::fused::fusion_enabled(),
            autocast: AutocastMode::OFF,
        }
    }

    /// Runs compiled models one kernel per IR node instead of their fused schedule (the
    /// default comes from `RTX_FUSION`, see `fused::fusion_enabled`). Results agree to
    /// rounding; this exists to check that and to measure what fusion buys.
    pub fn with_fusion(mut self, on: bool) -> Ctx {
        self.fuse = on;
        self
    }

    /// Mixed precision, as PyTorch's autocast: every operand and result of a matmul, linear
    /// layer, convolution and attention is rounded to `precision` (f32 accumulation inside),
    /// while parameters (the optimizer's master weights), normalization, softmax, losses and
    /// the residual stream stay f32. Gradients flowing back through those products are
    /// rounded the same way, so f16 needs a loss scale (`LossScaler`). `Precision::F32`, the
    /// default, rounds nothing.
    pub fn with_precision(mut self, precision: Precision) -> Ctx {
        self.autocast.precision = precision;
        self
    }

    /// The precision products are computed at.
    pub fn precision(&self) -> Precision {
        self.autocast.precision
    }

    /// Sets the loss scale: gradients are rounded as if the loss had been multiplied by
    /// `scale`, and come back unscaled. It must be a power of two (1, 2, 4, ..., or
    /// 1/2, 1/4, ...), so that scaling and unscaling are exact.
    pub fn set_loss_scale(&mut self, scale: f32) -> Result<()> {
        let is_power_of_two = scale.is_finite()
            && scale > 0.0
            && scale.is_normal()
            && scale.to_bits() & 0x007F_FFFF == 0;
        if !is_power_of_two {
            return Err(RtxError::Invalid(format!(
                "the loss scale must be a positive power of two (scaling must be exact), found {scale}"
            )));
        }
        self.autocast.loss_scale = scale;
        Ok(())
    }

    /// The loss scale gradients are rounded at (1 unless `set_loss_scale` changed it).
    pub fn loss_scale(&self) -> f32 {
        self.autocast.loss_scale
    }

    /// What `Autocast` nodes do in this call.
    pub fn autocast_mode(&self) -> AutocastMode {
        self.autocast
    }

    /// The same, in the CPU kernels' terms (read once per call by generated code).
    #[doc(hidden)]
    pub fn rounding(&self) -> Rounding {
        let to = match self.autocast.precision {
            Precision::F32 => return Rounding::NONE,
            Precision::Bf16 => HalfType::Bf16,
            Precision::F16 => HalfType::F16,
        };
        Rounding::new(to, self.autocast.loss_scale)
    }

    /// Whether compiled models run their fused schedule.
    pub fn fusion(&self) -> bool {
        self.fuse
    }

    /// Where the dropout seed stream stands (saved by training checkpoints).
    pub fn rng_state(&self) -> u64 {
        self.rng.state()
    }

    /// Continues the dropout seed stream from a saved `rng_state`.
    pub fn set_rng_state(&mut self, state: u64) {
        self.rng = Rng::new(state);
    }

    /// The seed of the next dropout mask.
    pub fn next_seed(&mut self) -> u64 {
        self.rng.next_u64()
    }
}
