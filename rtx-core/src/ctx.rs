//! Run-time context of a graph call: train or eval mode, and the dropout seed stream.

use crate::rng::Rng;

#[derive(Clone, Debug)]
pub struct Ctx {
    pub train: bool,
    rng: Rng,
    fuse: bool,
}

impl Ctx {
    /// Inference: dropout is the identity.
    pub fn eval() -> Ctx {
        Ctx {
            train: false,
            rng: Rng::new(0),
            fuse: crate::fused::fusion_enabled(),
        }
    }

    /// Training: dropout masks come from a stream seeded with `seed`, so two runs with the
    /// same seed draw the same masks.
    pub fn train(seed: u64) -> Ctx {
        Ctx {
            train: true,
            rng: Rng::new(seed),
            fuse: crate::fused::fusion_enabled(),
        }
    }

    /// Runs compiled models one kernel per IR node instead of their fused schedule (the
    /// default comes from `RTX_FUSION`, see `fused::fusion_enabled`). Results agree to
    /// rounding; this exists to check that and to measure what fusion buys.
    pub fn with_fusion(mut self, on: bool) -> Ctx {
        self.fuse = on;
        self
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
