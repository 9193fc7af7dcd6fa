//! `Flat<H, FLAT>` declares `[B, FLAT]` and computes `[B, 16*H*H]`: right only when
//! `FLAT = 16*H*H`. Nested as `Flat<8, 256>` it is wrong, and the nesting model reports it
//! (the nested model's own check only runs when its methods are instantiated).
use rtx_core::prelude::*;

#[model]
pub struct Flat<const H: usize, const FLAT: usize> {
    conv: Conv2d<1, 16, 3, 1, 1>,
}

#[model]
impl<const H: usize, const FLAT: usize> Flat<H, FLAT> {
    graph! {
        fn forward<B>(&self, x: [B, 1, H, H]) -> [B, FLAT] {
            flatten(relu(self.conv(x)), 1)
        }
    }
}

#[model]
pub struct Net {
    f: Flat<8, 256>,
    head: Linear<256, 2>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 1, 8, 8]) -> [B, 2] {
            self.head(self.f(x))
        }
    }
}

fn main() {
    let _ = Net::init(0).forward(&Tensor::zeros(&[1, 1, 8, 8]));
}
