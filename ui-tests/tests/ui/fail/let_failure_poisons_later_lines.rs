//! One mistake, one error: the lines after a failed `let` read its name without a second
//! error ("unknown variable `h`"), and the program that calls the model adds none.
use rtx_core::prelude::*;

#[model]
pub struct Net {
    fc1: Linear<16, 32>,
    fc2: Linear<64, 32>,
    head: Linear<32, 4>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 4] {
            let h = relu(self.fc1(x));
            let h2 = self.fc2(h);
            let z = tanh(h2) + h2;
            self.head(z)
        }
    }
}

fn main() {
    let net = Net::init(0);
    let y = net.forward(&Tensor::zeros(&[2, 16])).unwrap();
    println!("{:?}", y.shape());
}
