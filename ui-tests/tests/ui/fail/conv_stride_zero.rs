//! A convolution with stride 0 has no output size; PyTorch refuses it.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    conv: Conv2d<1, 4, 3, 0>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, img: [B, 1, 8, 8]) -> [B, 4, 6, 6] {
            self.conv(img)
        }
    }
}

fn main() {
    let _ = Net::init(0).forward(&Tensor::zeros(&[1, 1, 8, 8]));
}
