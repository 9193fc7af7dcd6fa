use rtx_core::prelude::*;

#[model]
pub struct Cnn {
    conv: Conv2d<1, 4, 3>,
}

#[model]
impl Cnn {
    graph! {
        fn forward<B>(&self, img: [B, 1, 4, 4]) -> [B, 4, 1, 1] {
            max_pool2d(relu(self.conv(img)), 3)
        }
    }
}

fn main() {}
