//! The symbolic batch dimension is used but not declared (`fn forward(..)` without `<B>`):
//! one error, at its first use, not one per use.
use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64, 32>,
    fc2: Linear<32, 10>,
}

#[model]
impl Mlp {
    graph! {
        fn forward(&self, x: [B, 64]) -> [B, 10] {
            self.fc2(relu(self.fc1(x)))
        }

        fn loss(&self, x: [B, 64], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

fn main() {
    let m = Mlp::init(0);
    let _ = m.forward(&Tensor::zeros(&[2, 64]));
}
