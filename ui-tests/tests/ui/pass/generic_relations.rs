//! Relations between generic parameters that hold for the values chosen build and run: the
//! flattened size `16*H*H == FLAT` and a 3x3 window over `H`, checked at instantiation, both
//! from `main` and through a model that nests the generic one.
use rtx_core::prelude::*;

#[model]
pub struct Cnn<const H: usize, const FLAT: usize> {
    conv: Conv2d<1, 16, 3>,
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
pub struct Net<const H: usize, const FLAT: usize> {
    cnn: Cnn<H, FLAT>,
    head: Linear<10, 2>,
}

#[model]
impl<const H: usize, const FLAT: usize> Net<H, FLAT> {
    graph! {
        fn forward<B>(&self, x: [B, 1, H, H]) -> [B, 2] {
            self.head(relu(self.cnn(x)))
        }
    }
}

fn main() {
    let small = Cnn::<4, 64>::init(0);
    assert_eq!(small.forward(&Tensor::zeros(&[2, 1, 4, 4])).unwrap().shape(), &[2, 10]);
    let big = Cnn::<6, 256>::init(0);
    assert_eq!(big.forward(&Tensor::zeros(&[1, 1, 6, 6])).unwrap().shape(), &[1, 10]);
    let net = Net::<5, 144>::init(0);
    assert_eq!(net.forward(&Tensor::zeros(&[3, 1, 5, 5])).unwrap().shape(), &[3, 2]);
}
