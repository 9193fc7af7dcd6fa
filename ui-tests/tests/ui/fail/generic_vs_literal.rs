use rtx_core::prelude::*;

#[model]
pub struct Head<const D: usize> {
    proj: Linear<64, D>,
    out: Linear<D, 10>,
}

#[model]
impl<const D: usize> Head<D> {
    graph! {
        fn forward<B>(&self, x: [B, D]) -> [B, 10] {
            self.out(gelu(self.proj(x)))
        }
    }
}

fn main() {}
