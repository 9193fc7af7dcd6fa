//! A model generic over its dimensions, instantiated twice.
use rtx_core::prelude::*;

#[model]
pub struct M<const IN: usize, const HID: usize> {
    fc1: Linear<IN, HID>,
    fc2: Linear<HID, 3>,
}

#[model]
impl<const IN: usize, const HID: usize> M<IN, HID> {
    graph! {
        fn forward<B>(&self, x: [B, IN]) -> [B, 3] {
            self.fc2(tanh(self.fc1(x)))
        }

        fn hidden<B>(&self, x: [B, IN]) -> [B, HID] {
            self.fc1(x)
        }
    }
}

fn main() {
    let m = M::<4, 8>::init(0);
    let out = m.forward(&Tensor::full(&[5, 4], 0.5)).unwrap();
    assert_eq!(out.shape(), &[5, 3]);
    assert_eq!(m.hidden(&Tensor::zeros(&[2, 4])).unwrap().shape(), &[2, 8]);
    assert_eq!(m.num_params(), 4 * 8 + 8 + 8 * 3 + 3);

    let wide = M::<16, 2>::init(1);
    assert_eq!(wide.forward(&Tensor::zeros(&[1, 16])).unwrap().shape(), &[1, 3]);
    // IN is checked when the input arrives.
    assert!(wide.forward(&Tensor::zeros(&[1, 4])).is_err());
}
