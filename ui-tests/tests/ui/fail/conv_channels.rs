use rtx_core::prelude::*;

#[model]
pub struct Cnn {
    conv: Conv2d<3, 8, 3, 1, 1>,
}

#[model]
impl Cnn {
    graph! {
        fn forward<B>(&self, img: [B, 1, 28, 28]) -> [B, 8, 28, 28] {
            relu(self.conv(img))
        }
    }
}

fn main() {}
