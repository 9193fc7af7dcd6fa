//! `forward` declares float ids but feeds them to an embedding: one error, in `forward`.
//! `loss`, which calls it with the right `i64` ids, adds no "argument must be f32" error
//! against the signature that is the mistake; `keepdim = true` is accepted in PyTorch's form.
use rtx_core::prelude::*;

#[model]
pub struct Lm {
    emb: Embedding<100, 32>,
    head: Linear<32, 100>,
}

#[model]
impl Lm {
    graph! {
        fn forward<B, T>(&self, ids: [B, T]) -> [B, T, 100] {
            let h = self.emb(ids);
            self.head(h - mean(h, 2, keepdim = true))
        }

        fn loss<B, T>(&self, ids: i64[B, T], next: i64[B, T]) -> [] {
            cross_entropy(self.forward(ids), next)
        }
    }
}

fn main() {
    let m = Lm::init(0);
    let ids = Tensor::from_i64(vec![1, 2, 3, 4], &[2, 2]).unwrap();
    let _ = m.loss_and_grads(&mut Ctx::train(0), &ids, &ids);
}
