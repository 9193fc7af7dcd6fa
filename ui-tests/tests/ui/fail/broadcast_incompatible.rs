use rtx_core::prelude::*;

#[model]
pub struct M {
    fc: Linear<8, 3>,
}

#[model]
impl M {
    graph! {
        fn forward<B>(&self, x: [B, 8], y: [B, 4]) -> [B, 3] {
            self.fc(x) * y
        }
    }
}

fn main() {}
