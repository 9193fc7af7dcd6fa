use rtx_core::prelude::*;

#[model]
pub struct Clf {
    fc: Linear<64, 10>,
}

#[model]
impl Clf {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            softmax(self.fc(x), 2)
        }
    }
}

fn main() {}
