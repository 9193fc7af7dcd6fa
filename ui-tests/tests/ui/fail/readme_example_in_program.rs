//! The README's example with its one deliberate mistake (`fc2: Linear<127, 10>`), in a program
//! that trains it: exactly one error, at the mistake.
use rtx_core::prelude::*;

#[model]
pub struct Mlp {
    fc1: Linear<64, 128>,
    fc2: Linear<127, 10>,
}

#[model]
impl Mlp {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            self.fc2(dropout(relu(self.fc1(x)), 0.3))
        }

        fn loss<B>(&self, x: [B, 64], y: i64[B]) -> [] {
            cross_entropy(self.forward(x), y)
        }
    }
}

fn step(model: &mut Mlp, opt: &mut Adam, x: &Tensor, y: &Tensor) -> Result<f32> {
    let (loss, grads) = model.loss_and_grads(&mut Ctx::train(0), x, y)?;
    opt.step(model, &grads)?;
    loss.item()
}

fn main() -> Result<()> {
    let mut model = Mlp::init(0);
    let mut opt = Adam::new(1e-3);
    let x = Tensor::zeros(&[4, 64]);
    let y = Tensor::from_i64(vec![0, 1, 2, 3], &[4])?;
    println!("{}", step(&mut model, &mut opt, &x, &y)?);
    println!("{:?}", model.forward(&x)?.shape());
    println!("{}", Mlp::graph()?.to_text());
    Ok(())
}
