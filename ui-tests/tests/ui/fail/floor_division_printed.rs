//! A strided convolution over a symbolic height leaves a floor division in the shape; it is
//! printed as `floor((H - 3) / 2) + 1`, not as an ambiguous `(H - 3)/2 + 1`.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    conv: Conv2d<1, 4, 3, 2>,
}

#[model]
impl Net {
    graph! {
        fn forward<B, H>(&self, img: [B, 1, H, H]) -> [B, 4, H, H] {
            self.conv(img)
        }
    }
}

fn main() {}
