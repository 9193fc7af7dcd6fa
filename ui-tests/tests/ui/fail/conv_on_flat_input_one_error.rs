//! A convolution applied to a flat input: one error at the conv; the pool and the linear
//! layer after it read a poisoned value and stay silent.
use rtx_core::prelude::*;

#[model]
pub struct Cnn {
    conv: Conv2d<1, 8, 3>,
    fc: Linear<288, 10>,
}

#[model]
impl Cnn {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            let h = relu(self.conv(x));
            let p = max_pool2d(h, 2);
            self.fc(flatten(p, 1))
        }
    }
}

fn main() {}
