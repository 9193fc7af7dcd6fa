//! A struct-level mistake (a misspelled layer type) in a nested model: one error, at the
//! field; the impl, the outer model and `main` add none.
use rtx_core::prelude::*;

#[model]
pub struct Encoder {
    fc: Linaer<16, 8>,
}

#[model]
impl Encoder {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 8] {
            relu(self.fc(x))
        }
    }
}

#[model]
pub struct Classifier {
    enc: Encoder,
    head: Linear<8, 2>,
}

#[model]
impl Classifier {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 2] {
            self.head(self.enc(x))
        }
    }
}

fn main() -> Result<()> {
    let model = Classifier::init(0);
    let out = model.forward(&Tensor::zeros(&[3, 16]))?;
    println!("{:?} {}", out.shape(), Encoder::init(0).num_params());
    Ok(())
}
