//! An attention mask declared for 15 keys where the scores have 16: the mask cannot broadcast,
//! and the error shows both shapes at the mask.
use rtx_core::prelude::*;

#[model]
pub struct Scores {
    q: Linear<8, 8>,
}

#[model]
impl Scores {
    graph! {
        fn forward<B>(&self, x: [B, 16, 8], mask: [16, 15]) -> [B, 16, 16] {
            let q = self.q(x);
            let att = matmul(q, transpose(x, 1, 2));
            softmax(masked_fill(att, mask, -1e9), -1)
        }
    }
}

fn main() {}
