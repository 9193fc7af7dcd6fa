//! Two-layer perceptron for 8x8 digit images: the model of DESIGN.md's target experience.

use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64, 128>,
    fc2: Linear<128, 10>,
}

#[model]
impl Mlp {
    graph! {
        // B is symbolic, bound at run time; 64 and 10 are checked now.
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc2(dropout(relu(self.fc1(x)), 0.3))
        }

        fn loss<B>(&self, x: [B, 64], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}
