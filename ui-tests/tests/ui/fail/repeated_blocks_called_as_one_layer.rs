use rtx_core::prelude::*;

#[model]
pub struct Block {
    fc: Linear<8, 8>,
}

#[model]
impl Block {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 8] {
            relu(self.fc(x)) + x
        }
    }
}

#[model]
pub struct Deep {
    blocks: [Block; 4],
}

#[model]
impl Deep {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 8] {
            self.blocks(x)
        }
    }
}

fn main() {
    let model = Deep::init(0);
    let _ = model.forward(&Tensor::zeros(&[1, 8]));
}
