//! Run-time context of a graph call: train or eval mode, and the dropout seed stream.

use crate::rng::Rng;

#[derive(Clone, Debug)]
pub struct Ctx {
    pub train: bool,
    rng: Rng,
}

impl Ctx {
    /// Inference: dropout is the identity.
    pub fn eval() -> Ctx {
        Ctx {
            train: false,
            rng: Rng::new(0),
        }
    }

    /// Training: dropout masks come from a stream seeded with `seed`, so two runs with the
    /// same seed draw the same masks.
    pub fn train(seed: u64) -> Ctx {
        Ctx {
            train: true,
            rng: Rng::new(seed),
        }
    }

    /// The seed of the next dropout mask.
    pub fn next_seed(&mut self) -> u64 {
        self.rng.next_u64()
    }
}
