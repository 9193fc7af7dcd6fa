use rtx_core::prelude::*;

#[model]
pub struct Pos {
    ln: LayerNorm<32>,
}

#[model]
impl Pos {
    graph! {
        // `[B, T, C] + [B, C]` lines up T with B: two different symbolic dimensions.
        fn forward<B, T>(&self, x: [B, T, 32], bias: [B, 32]) -> [B, T, 32] {
            self.ln(x + bias)
        }
    }
}

fn main() {}
