use rtx_core::prelude::*;

#[model]
pub struct Unflatten {
    fc: Linear<64, 64>,
}

#[model]
impl Unflatten {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 8, 9] {
            reshape(self.fc(x), [B, 8, 9])
        }
    }
}

fn main() {}
