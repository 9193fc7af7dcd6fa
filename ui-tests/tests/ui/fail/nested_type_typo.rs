use rtx_core::prelude::*;

#[model]
pub struct Encoder {
    fc: Linear<16, 8>,
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
    enc: Encodr,
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

fn main() {}
