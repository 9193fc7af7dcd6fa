use rtx_core::prelude::*;

#[model]
pub struct Join {
    fc: Linear<16, 16>,
}

#[model]
impl Join {
    graph! {
        fn forward<B>(&self, a: [B, 4, 16], b: [B, 5, 16]) -> [B, 4, 32] {
            concat([self.fc(a), self.fc(b)], 2)
        }
    }
}

fn main() {}
