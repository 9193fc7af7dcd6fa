//! A rotary embedding turns pairs of features: on heads of 5 features it cannot, and
//! `cargo check` says so at the call.
use rtx_core::prelude::*;

#[model]
pub struct Attention {
    qkv: Linear<20, 60>,
}

#[model]
impl Attention {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 20]) -> [B, 4, T, 5] {
            let q = split_heads(narrow(self.qkv(x), 2, 0, 20), 4);
            rope(q)
        }
    }
}

fn main() {
    let _ = Attention::init(0).forward(&Tensor::zeros(&[1, 3, 20]));
}
