//! A layer type with a missing argument: one error at the field; `main`, which calls the
//! model, adds none.
use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64>,
    fc2: Linear<32, 10>,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc2(relu(self.fc1(x)))
        }
    }
}

fn main() {
    let m = Mlp::init(0);
    let _ = m.forward(&Tensor::zeros(&[2, 64]));
    println!("{}", m.num_params());
}
