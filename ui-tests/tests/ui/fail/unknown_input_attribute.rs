use rtx_core::prelude::*;

#[model]
pub struct Clf {
    fc: Linear<64, 10>,
}

#[model]
impl Clf {
    graph! {
        fn loss<B>(&self, #[gradient] x: [B, 64], y: i64[B]) -> [] {
            cross_entropy(self.fc(x), y)
        }
    }
}

fn main() {}
