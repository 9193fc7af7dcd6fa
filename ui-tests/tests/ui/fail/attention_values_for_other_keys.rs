use rtx_core::prelude::*;

#[model]
pub struct Memory {
    q: Linear<64, 32>,
    k: Linear<64, 32>,
}

#[model]
impl Memory {
    graph! {
        // One value row per key: v must have M rows, as k does, not T.
        fn forward<B, T, M>(&self, x: [B, T, 64], memory: [B, M, 64], values: [B, T, 32]) -> [B, T, 32] {
            attention(self.q(x), self.k(memory), values)
        }
    }
}

fn main() {
    let model = Memory::init(0);
    let _ = model.forward(
        &Tensor::zeros(&[1, 4, 64]),
        &Tensor::zeros(&[1, 6, 64]),
        &Tensor::zeros(&[1, 4, 32]),
    );
}
