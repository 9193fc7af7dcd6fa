//! A model with a shape error, nested in another and called from `main`: the one error is the
//! mistake inside `Block`; the outer model and the program still see `Block` as a model.
use rtx_core::prelude::*;

#[model]
pub struct Block {
    fc: Linear<32, 32>,
    norm: LayerNorm<16>,
}

#[model]
impl Block {
    graph! {
        fn forward<B>(&self, x: [B, 32]) -> [B, 32] {
            self.norm(relu(self.fc(x))) + x
        }
    }
}

#[model]
pub struct Net {
    inp: Linear<8, 32>,
    block: Block,
    out: Linear<32, 3>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 3] {
            self.out(self.block(self.inp(x)))
        }

        fn loss<B>(&self, x: [B, 8], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

fn main() -> Result<()> {
    let net = Net::init(0);
    let block = Block::init(1);
    let x = Tensor::zeros(&[2, 8]);
    let y = Tensor::from_i64(vec![0, 2], &[2])?;
    let (loss, grads) = net.loss_and_grads(&mut Ctx::train(0), &x, &y)?;
    println!("{} {}", loss.item()?, grads.len());
    println!("{:?}", block.forward(&Tensor::zeros(&[2, 32]))?.shape());
    Ok(())
}
