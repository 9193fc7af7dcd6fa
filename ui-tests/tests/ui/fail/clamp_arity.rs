use rtx_core::prelude::*;

#[model]
pub struct Clip {
    fc: Linear<8, 4>,
}

#[model]
impl Clip {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 4] {
            clamp(self.fc(x), 1.0)
        }
    }
}

fn main() {}
