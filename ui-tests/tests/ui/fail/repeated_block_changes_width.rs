use rtx_core::prelude::*;

// Each block maps width 8 to 16, so the loop's second pass reads 16 where 8 is expected.
#[model]
pub struct Widen {
    fc: Linear<8, 16>,
}

#[model]
impl Widen {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 16] {
            relu(self.fc(x))
        }
    }
}

#[model]
pub struct Deep {
    blocks: [Widen; 3],
}

#[model]
impl Deep {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 16] {
            let mut h = x;
            for block in &self.blocks {
                h = block(h);
            }
            h
        }
    }
}

fn main() {
    let model = Deep::init(0);
    let _ = model.forward(&Tensor::zeros(&[1, 8]));
}
