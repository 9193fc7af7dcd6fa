//! Four independent mistakes (a misspelled op, a wrong argument count, a misspelled field, a
//! misspelled variable) give four errors, and nothing for the lines that read their results.
use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64, 32>,
    fc2: Linear<32, 10>,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            let h = rellu(self.fc1(x));
            let g = self.fc1(x, x);
            let z = self.fc3(h) + g;
            self.fc2(hh)
        }

        fn probs<B>(&self, x: [B, 64]) -> [B, 10] {
            softmax(self.forward(x), 1)
        }
    }
}

fn main() {
    let m = Mlp::init(0);
    let _ = m.probs(&Tensor::zeros(&[2, 64]));
}
