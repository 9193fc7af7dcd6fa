use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc: Linear<64, 10>,
}

#[model]
impl Mpl {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc(x)
        }
    }
}

fn main() {}
