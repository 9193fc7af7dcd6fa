//! `B` appears in the inputs only inside `B * T`: no input axis gives its value on entry.
//! Refused at the input, in plain words, instead of an internal error.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    fc: Linear<16, 4>,
}

#[model]
impl Net {
    graph! {
        fn forward<B, T>(&self, x: [B * T, 16], mask: [T]) -> [B, T, 4] {
            reshape(self.fc(x), [B, T, 4])
        }
    }
}

fn main() {
    let _ = Net::init(0).forward(&Tensor::zeros(&[6, 16]), &Tensor::zeros(&[3]));
}
