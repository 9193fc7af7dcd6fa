//! A batched matmul whose batch dimensions disagree (4 heads against 2): the message shows
//! both operands in full and says which dimensions are the batch.
use rtx_core::prelude::*;

#[model]
pub struct Attn {
    fc: Linear<8, 8>,
}

#[model]
impl Attn {
    graph! {
        fn scores<B, T>(&self, q: [B, 4, T, 8], k: [B, 2, 8, T]) -> [B, 4, T, T] {
            matmul(self.fc(q), k)
        }
    }
}

fn main() {}
