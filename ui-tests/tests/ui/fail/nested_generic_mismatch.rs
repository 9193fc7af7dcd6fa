use rtx_core::prelude::*;

#[model]
pub struct Block<const D: usize> {
    fc: Linear<D, D>,
}

#[model]
impl<const D: usize> Block<D> {
    graph! {
        fn forward<B>(&self, x: [B, D]) -> [B, D] {
            x + relu(self.fc(x))
        }
    }
}

#[model]
pub struct Net<const IN: usize, const HID: usize> {
    proj: Linear<IN, HID>,
    block: Block<IN>,
}

#[model]
impl<const IN: usize, const HID: usize> Net<IN, HID> {
    graph! {
        fn forward<B>(&self, x: [B, IN]) -> [B, IN] {
            self.block(self.proj(x))
        }
    }
}

fn main() {}
