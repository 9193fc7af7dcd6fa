//! A generic-vs-literal mismatch is reported with the graph's other errors, not dropped, and
//! reads like a literal one: the op and both shapes.
use rtx_core::prelude::*;

#[model]
pub struct Head<const D: usize> {
    proj: Linear<64, D>,
    out: Linear<D, 10>,
}

#[model]
impl<const D: usize> Head<D> {
    graph! {
        fn forward<B>(&self, x: [B, D]) -> [B, 10] {
            let h = gelu(self.proj(x));
            let p = softmax(x, 2);
            self.out(h) + p
        }
    }
}

fn main() {
    let head = Head::<64>::init(0);
    let _ = head.forward(&Tensor::zeros(&[2, 64]));
}
