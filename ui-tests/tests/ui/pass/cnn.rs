//! A CNN with conv, max and average pooling and flatten.
use rtx_core::prelude::*;

#[model]
pub struct Cnn {
    conv1: Conv2d<1, 8, 3, 1, 1>,
    conv2: Conv2d<8, 16, 3, 2, 1>,
    fc: Linear<16, 10>,
}

#[model]
impl Cnn {
    graph! {
        fn forward<B>(&self, x: [B, 1, 8, 8]) -> [B, 10] {
            let h = max_pool2d(relu(self.conv1(x)), 2);   // [B, 8, 4, 4]
            let h = relu(self.conv2(h));                  // [B, 16, 2, 2]
            let h = avg_pool2d(h, 2);                     // [B, 16, 1, 1]
            self.fc(flatten(h))
        }

        fn loss<B>(&self, x: [B, 1, 8, 8], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

fn main() {
    let m = Cnn::init(3);
    let x = Tensor::from_vec((0..2 * 64).map(|i| (i % 5) as f32).collect(), &[2, 1, 8, 8]).unwrap();
    assert_eq!(m.forward(&x).unwrap().shape(), &[2, 10]);
    let y = Tensor::from_i64(vec![0, 7], &[2]).unwrap();
    let (loss, grads) = m.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap();
    assert!(loss.item().unwrap().is_finite());
    assert_eq!(grads.get("conv1.weight").unwrap().shape(), &[8, 1, 3, 3]);
    assert_eq!(grads.get("conv2.weight").unwrap().shape(), &[16, 8, 3, 3]);
}
