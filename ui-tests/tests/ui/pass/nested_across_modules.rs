//! A model nests another defined in a different module and imported with `use`, and one named
//! by a path: the nested definitions are found through the types' own names.
mod blocks {
    pub mod enc {
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
    }

    pub mod head {
        use rtx_core::prelude::*;

        #[model]
        pub struct Head {
            fc: Linear<8, 3>,
        }

        #[model]
        impl Head {
            graph! {
                fn forward<B>(&self, x: [B, 8]) -> [B, 3] {
                    self.fc(x)
                }
            }
        }
    }
}

use blocks::enc::Encoder;
use rtx_core::prelude::*;

#[model]
pub struct Classifier {
    enc: Encoder,
    head: blocks::head::Head,
}

#[model]
impl Classifier {
    graph! {
        fn forward<B>(&self, x: [B, 16]) -> [B, 3] {
            self.head(self.enc(x))
        }
    }
}

fn main() {
    let m = Classifier::init(0);
    assert_eq!(m.forward(&Tensor::zeros(&[2, 16])).unwrap().shape(), &[2, 3]);
    let names: Vec<String> = m.named_params().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"enc.fc.weight".to_string()), "{names:?}");
    assert!(names.contains(&"head.fc.bias".to_string()), "{names:?}");
}
