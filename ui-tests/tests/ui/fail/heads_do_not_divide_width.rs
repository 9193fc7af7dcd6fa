//! Attention with 3 heads over a width of 32: the head count does not divide the width, and
//! `cargo check` says so at the head count. The lines after it stay silent.
use rtx_core::prelude::*;

#[model]
pub struct Attention {
    qkv: Linear<32, 96>,
    proj: Linear<32, 32>,
}

#[model]
impl Attention {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 32]) -> [B, T, 32] {
            let qkv = self.qkv(x);
            let q = split_heads(narrow(qkv, 2, 0, 32), 3);
            let k = split_heads(narrow(qkv, 2, 32, 32), 4);
            let v = split_heads(narrow(qkv, 2, 64, 32), 4);
            let att = softmax(matmul(q, transpose(k, 2, 3)) * 0.35, -1);
            self.proj(merge_heads(matmul(att, v)))
        }
    }
}

fn main() {
    let m = Attention::init(0);
    let _ = m.forward(&Tensor::zeros(&[2, 5, 32]));
}
