//! A model that nests another: `self.enc(x)` runs its `forward`, `self.enc.features(x)` another
//! graph function.
use rtx_core::prelude::*;

#[model]
pub struct Encoder {
    fc: Linear<16, 8>,
}

#[model]
impl Encoder {
    graph! {
        fn features<B>(&self, x: [B, 16]) -> [B, 8] {
            self.fc(x)
        }

        fn forward<B>(&self, x: [B, 16]) -> [B, 8] {
            relu(self.features(x))
        }
    }
}

#[model]
pub struct Classifier {
    enc: Encoder,
    head: Linear<16, 2>,
}

#[model]
impl Classifier {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 2] {
            self.head(concat([self.enc(x), self.enc.features(x)], 1))
        }

        fn loss<B>(&self, x: [B, 16], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

fn main() {
    let m = Classifier::init(0);
    let x = Tensor::full(&[4, 16], 0.25);
    assert_eq!(m.forward(&x).unwrap().shape(), &[4, 2]);
    assert_eq!(m.enc.forward(&x).unwrap().shape(), &[4, 8]);
    let y = Tensor::from_i64(vec![0, 1, 1, 0], &[4]).unwrap();
    let (_, grads) = m.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap();
    assert_eq!(grads.get("enc.fc.weight").unwrap().shape(), &[8, 16]);
    assert_eq!(grads.get("head.weight").unwrap().shape(), &[2, 16]);
}
