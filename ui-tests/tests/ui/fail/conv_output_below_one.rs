use rtx_core::prelude::*;

#[model]
pub struct Cnn {
    conv: Conv2d<1, 4, 5>,
}

#[model]
impl Cnn {
    graph! {
        fn forward<B>(&self, img: [B, 1, 3, 3]) -> [B, 4, 1, 1] {
            self.conv(img)
        }
    }
}

fn main() {}
