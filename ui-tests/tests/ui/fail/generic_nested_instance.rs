//! A generic model that is right in general but wrong for the values a nesting model picks
//! (`Cnn<8, 256>`: the flattened size is 1024): decided when the outer model expands, at
//! `cargo check`, with a note naming the instance.
use rtx_core::prelude::*;

#[model]
pub struct Cnn<const H: usize, const FLAT: usize> {
    conv: Conv2d<1, 16, 3, 1, 1>,
    fc: Linear<FLAT, 10>,
}

#[model]
impl<const H: usize, const FLAT: usize> Cnn<H, FLAT> {
    graph! {
        fn forward<B>(&self, x: [B, 1, H, H]) -> [B, 10] {
            self.fc(flatten(relu(self.conv(x)), 1))
        }
    }
}

#[model]
pub struct Net {
    cnn: Cnn<8, 256>,
    head: Linear<10, 2>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 1, 8, 8]) -> [B, 2] {
            self.head(self.cnn(x))
        }
    }
}

fn main() {
    let _ = Net::init(0).forward(&Tensor::zeros(&[1, 1, 8, 8]));
}
