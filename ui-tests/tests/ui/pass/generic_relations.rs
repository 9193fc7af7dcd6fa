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

/// Relations with symbols in them: the flattened size `C*H*W == FLAT` next to the batch, and a
/// head split whose `-1` is `D / 4` (D a multiple of 4 at instantiation).
#[model]
pub struct Heads<const C: usize, const HW: usize, const FLAT: usize, const D: usize> {
    proj: Linear<FLAT, D>,
}

#[model]
impl<const C: usize, const HW: usize, const FLAT: usize, const D: usize> Heads<C, HW, FLAT, D> {
    graph! {
        fn forward<B, T>(&self, x: [B, C, HW, HW], t: [T]) -> [B, 4, D / 4] {
            let flat = reshape(x, [B, FLAT]);
            let h = self.proj(flat);
            let split = reshape(h, [B, 4, -1]);
            reshape(split, [B, 4, D / 4]) * 1.0 + reshape(h, [B, 4, D / 4])
        }
    }
}

fn main() {
    let heads = Heads::<2, 3, 18, 8>::init(0);
    let out = heads
        .forward(&Tensor::zeros(&[5, 2, 3, 3]), &Tensor::zeros(&[7]))
        .unwrap();
    assert_eq!(out.shape(), &[5, 4, 2]);

    let small = Cnn::<4, 64>::init(0);
    assert_eq!(small.forward(&Tensor::zeros(&[2, 1, 4, 4])).unwrap().shape(), &[2, 10]);
    let big = Cnn::<6, 256>::init(0);
    assert_eq!(big.forward(&Tensor::zeros(&[1, 1, 6, 6])).unwrap().shape(), &[1, 10]);
    let net = Net::<5, 144>::init(0);
    assert_eq!(net.forward(&Tensor::zeros(&[3, 1, 5, 5])).unwrap().shape(), &[3, 2]);
}
