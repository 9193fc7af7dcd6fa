use rtx_core::prelude::*;

#[model]
pub struct Gate {
    fc: Linear<8, 4>,
}

#[model]
impl Gate {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 4] {
            let h = self.fc(x);
            where(h > 0.0, h, x)
        }
    }
}

fn main() {}
