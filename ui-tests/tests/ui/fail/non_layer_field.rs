use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc: Linear<64, 10>,
    scale: f32,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc(x)
        }
    }
}

fn main() {}
