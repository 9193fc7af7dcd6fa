use rtx_core::prelude::*;

#[model]
pub struct Proj<const IN: usize, const OUT: usize> {
    fc: Linear<IN, OUT>,
}

#[model]
impl<const IN: usize, const OUT: usize> Proj<IN, OUT> {
    graph! {
        fn forward<B>(&self, x: [B, IN]) -> [B, IN] {
            relu(self.fc(x))
        }
    }
}

fn main() {}
