//! A relation between generic parameters (`16 * H * H == FLAT`) cannot be decided for every
//! value, so it is checked when the model is instantiated: `Cnn::<8, 256>` is wrong (the
//! flattened size is 1024), and the build says so at the op, with the values.
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

fn main() {
    let ok = Cnn::<4, 256>::init(0);
    let _ = ok.forward(&Tensor::zeros(&[1, 1, 4, 4]));
    let wrong = Cnn::<8, 256>::init(0);
    let _ = wrong.forward(&Tensor::zeros(&[1, 1, 8, 8]));
}
