use rtx_core::prelude::*;

#[model]
pub struct Attn {
    wq: Param2<16, 32>,
}

#[model]
impl Attn {
    graph! {
        fn forward<B>(&self, x: [B, 8, 24]) -> [B, 8, 32] {
            matmul(x, self.wq)
        }
    }
}

fn main() {}
