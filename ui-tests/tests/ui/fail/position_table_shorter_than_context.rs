//! A learned position table of 32 rows for a context of 64: the embedding of positions 32..63
//! does not exist, and `cargo check` says so at the positions.
use rtx_core::prelude::*;

#[model]
pub struct Gpt {
    wte: Embedding<65, 16>,
    wpe: Embedding<32, 16>,
    head: Linear<16, 65>,
}

#[model]
impl Gpt {
    graph! {
        fn forward<B>(&self, idx: i64[B, 64]) -> [B, 64, 65] {
            let x = self.wte(idx) + self.wpe(positions(idx, 1));
            self.head(x)
        }
    }
}

fn main() {
    let ids = Tensor::from_i64(vec![0; 64], &[1, 64]).unwrap();
    let _ = Gpt::init(0).forward(&ids);
}
