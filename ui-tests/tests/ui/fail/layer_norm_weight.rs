use rtx_core::prelude::*;

#[model]
pub struct Norm {
    fc: Linear<64, 32>,
    gain: Param1<16>,
    shift: Param1<32>,
}

#[model]
impl Norm {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 32] {
            layer_norm(self.fc(x), self.gain, self.shift)
        }
    }
}

fn main() {}
