//! A width `D` split into 4 heads is right only when 4 divides `D`: checked when the program
//! instantiates the model, so `Mixer::<10>` stops the build with the values and the op.
use rtx_core::prelude::*;

#[model]
pub struct Mixer<const D: usize> {
    proj: Linear<D, D>,
}

#[model]
impl<const D: usize> Mixer<D> {
    graph! {
        fn forward<B, T>(&self, x: [B, T, D]) -> [B, T, D] {
            let h = split_heads(self.proj(x), 4);
            merge_heads(h * h)
        }
    }
}

fn main() {
    let fine = Mixer::<8>::init(0);
    let _ = fine.forward(&Tensor::zeros(&[1, 2, 8]));
    let wrong = Mixer::<10>::init(0);
    let _ = wrong.forward(&Tensor::zeros(&[1, 2, 10]));
}
