//! A small CNN for 8x8 digit images: conv-pool-conv-pool-linear.

use rtx_core::prelude::*;

#[model]
pub struct Cnn {
    conv1: Conv2d<1, 16, 3, 1, 1>,
    conv2: Conv2d<16, 32, 3, 1, 1>,
    fc: Linear<128, 10>,
}

#[model]
impl Cnn {
    graph! {
        fn forward<B>(&self, x: [B, 1, 8, 8]) -> [B, 10] {
            let h = max_pool2d(relu(self.conv1(x)), 2);      // [B, 16, 4, 4]
            let h = max_pool2d(relu(self.conv2(h)), 2);      // [B, 32, 2, 2]
            self.fc(dropout(flatten(h), 0.25))
        }

        fn loss<B>(&self, x: [B, 1, 8, 8], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}
