use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64, 128>,
    fc2: Linear<128, 10>,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            softmax(self.fc1(x), -1)
        }
    }
}

fn main() {}
