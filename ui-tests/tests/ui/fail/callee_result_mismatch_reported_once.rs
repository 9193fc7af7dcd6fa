//! `forward` computes [B, 12] but declares [B, 10]: one error, in `forward`. `loss`, which
//! calls it and subtracts a [B, 10] target, sees the call as failed, not as a [B, 12] value.
use rtx_core::prelude::*;

#[model]
pub struct Reg {
    fc1: Linear<8, 32>,
    fc2: Linear<32, 12>,
}

#[model]
impl Reg {
    graph! {
        fn forward<B>(&self, x: [B, 8]) -> [B, 10] {
            self.fc2(relu(self.fc1(x)))
        }

        fn loss<B>(&self, x: [B, 8], target: [B, 10]) -> [] {
            let d = self.forward(x) - target;
            mean(d * d)
        }
    }
}

fn main() {
    let m = Reg::init(0);
    let x = Tensor::zeros(&[4, 8]);
    let (loss, _) = m.loss_and_grads(&mut Ctx::eval(), &x, &Tensor::zeros(&[4, 10])).unwrap();
    println!("{}", loss.item().unwrap());
}
