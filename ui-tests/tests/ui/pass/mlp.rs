//! The MLP of DESIGN.md: forward, a loss, its compiled gradients, and a run-time shape error.
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
            self.fc2(dropout(relu(self.fc1(x)), 0.3))
        }

        fn loss<B>(&self, x: [B, 64], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

fn main() {
    let m = Mlp::init(0);
    let x = Tensor::from_vec((0..3 * 64).map(|i| (i % 7) as f32 / 7.0).collect(), &[3, 64]).unwrap();
    let out = m.forward(&x).unwrap();
    assert_eq!(out.shape(), &[3, 10]);

    let y = Tensor::from_i64(vec![1, 2, 9], &[3]).unwrap();
    let (loss, grads) = m.loss_and_grads(&mut Ctx::train(7), &x, &y).unwrap();
    assert!(loss.shape().is_empty());
    assert!(loss.item().unwrap().is_finite());
    assert_eq!(grads.len(), 4);
    assert_eq!(grads.get("fc1.weight").unwrap().shape(), &[128, 64]);
    assert_eq!(grads.get("fc2.bias").unwrap().shape(), &[10]);

    // A wrong shape at run time is an error, not a panic.
    assert!(m.forward(&Tensor::zeros(&[3, 63])).is_err());
    assert_eq!(Mlp::graph().unwrap().functions.len(), 2);
}
