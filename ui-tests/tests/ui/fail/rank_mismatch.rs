use rtx_core::prelude::*;

#[model]
pub struct Reg {
    fc: Linear<8, 1>,
}

#[model]
impl Reg {
    graph! {
        fn loss<B>(&self, x: [B, 8], target: [B]) -> [] {
            mse(self.fc(x), target)
        }
    }
}

fn main() {}
