use rtx_core::prelude::*;

#[model]
pub struct CrossAttention {
    q: Linear<64, 32>,
    k: Linear<64, 16>,
    v: Linear<64, 32>,
}

#[model]
impl CrossAttention {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 64]) -> [B, T, 32] {
            attention(self.q(x), self.k(x), self.v(x), causal = true)
        }
    }
}

fn main() {
    let model = CrossAttention::init(0);
    let _ = model.forward(&Tensor::zeros(&[1, 4, 64]));
}
