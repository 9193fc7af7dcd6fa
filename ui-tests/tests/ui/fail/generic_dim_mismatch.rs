use rtx_core::prelude::*;

#[model]
pub struct Mlp<const IN: usize, const HID: usize> {
    fc1: Linear<IN, HID>,
    fc2: Linear<IN, 10>,
}

#[model]
impl<const IN: usize, const HID: usize> Mlp<IN, HID> {
    graph! {
        fn forward<B>(&self, x: [B, IN]) -> [B, 10] {
            self.fc2(relu(self.fc1(x)))
        }
    }
}

fn main() {}
