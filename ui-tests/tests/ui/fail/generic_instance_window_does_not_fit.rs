//! A 5x5 kernel over a generic `H`: `Cnn::<3>` cannot hold one window. Found when the program
//! instantiates it, at build time, never at run time.
use rtx_core::prelude::*;

#[model]
pub struct Cnn<const H: usize> {
    conv: Conv2d<1, 4, 5>,
}

#[model]
impl<const H: usize> Cnn<H> {
    graph! {
        fn forward<B>(&self, x: [B, 1, H, H]) -> [B, 4, H - 4, H - 4] {
            relu(self.conv(x))
        }
    }
}

fn main() {
    let fits = Cnn::<5>::init(0);
    let _ = fits.forward(&Tensor::zeros(&[1, 1, 5, 5]));
    let small = Cnn::<3>::init(0);
    let _ = small.forward(&Tensor::zeros(&[1, 1, 3, 3]));
}
