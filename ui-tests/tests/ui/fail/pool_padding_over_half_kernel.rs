//! PyTorch refuses pool padding larger than half the kernel (a window of padding alone would
//! give -inf); so does `graph!`.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    conv: Conv2d<1, 4, 3, 1, 1>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, img: [B, 1, 8, 8]) -> [B, 4, 5, 5] {
            max_pool2d(relu(self.conv(img)), 2, 2, 2)
        }
    }
}

fn main() {
    let _ = Net::init(0).forward(&Tensor::zeros(&[1, 1, 8, 8]));
}
