use rtx_core::prelude::*;

#[model]
pub struct Net {
    fc1: Linear<64, 128>,
    fc2: Linear<127, 10>,
}

#[model]
impl Net {
    graph! {
        fn forward<B>(&self, x: [B, 64]) -> [B, 10] {
            let h = rellu(self.fc1(x));
            let p = softmax(self.fc1(x), 3);
            self.fc2(relu(self.fc1(x)))
        }

        fn loss<B>(&self, x: [B, 64], y: [B]) -> [] {
            cross_entropy(self.fc1(x), y)
        }
    }
}

fn main() {}
