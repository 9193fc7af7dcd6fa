//! `reshape(x, [B, 5, -1])` of a [B, 48] tensor: 48 is not a multiple of 5, so the -1 has no
//! value; the error says so at the -1.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    fc: Linear<16, 48>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 5, 10] {
            reshape(self.fc(x), [B, 5, -1])
        }
    }
}

fn main() {}
