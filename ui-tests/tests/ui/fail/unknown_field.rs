use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64, 32>,
    fc2: Linear<32, 10>,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc2(relu(self.fc3(x)))
        }
    }
}

fn main() {}
