use rtx_core::prelude::*;

#[model]
pub struct Clf {
    fc: Linear<64, 10>,
}

#[model]
impl Clf {
    graph! {
        fn best<B>(&self, x: [B, 64]) -> [B, 12] {
            top_k(self.fc(x), 12)
        }
    }
}

fn main() {}
