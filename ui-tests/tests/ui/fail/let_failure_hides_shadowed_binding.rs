//! A failed `let h = ..` that shadows an earlier `h` must not leave the old value in place:
//! the next line would be checked against the stale [B, 8] and get a false error.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    fc1: Linear<8, 24>,
    fc2: Linear<16, 24>,
    head: Linear<24, 2>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 2] {
            let h = x;
            let h = self.fc2(relu(h));
            self.head(h)
        }
    }
}

fn main() {
    let net = Net::init(0);
    let _ = net.forward(&Tensor::zeros(&[1, 8]));
}
