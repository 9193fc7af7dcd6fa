//! `x - mean(x, 1)`: the mean dropped axis 1, so [B, 16] and [B] do not broadcast; the help
//! line says `keepdim` fixes it.
use rtx_core::prelude::*;

#[model]
pub struct Norm {
    fc: Linear<16, 16>,
}

#[model]
impl Norm {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 16] {
            let h = self.fc(x);
            h - mean(h, 1)
        }
    }
}

fn main() {}
