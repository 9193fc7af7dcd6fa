//! `let h: [B, 32] = ..` is not graph! syntax: one error, and the lines reading `h` stay quiet.
use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<16, 32>,
    fc2: Linear<32, 4>,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 4] {
            let h: [B, 32] = relu(self.fc1(x));
            self.fc2(h)
        }
    }
}

fn main() {
    let _ = Mlp::init(0).forward(&Tensor::zeros(&[1, 16]));
}
