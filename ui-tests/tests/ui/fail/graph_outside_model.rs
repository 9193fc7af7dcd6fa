use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc: Linear<64, 10>,
}

impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc(x)
        }
    }
}

fn main() {
    let m = Mlp::init(0);
    let _ = m.forward(&Tensor::zeros(&[1, 64]));
}
