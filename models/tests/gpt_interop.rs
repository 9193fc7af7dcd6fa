//! PyTorch interop: a tiny GPT with the layout of `models::gpt` (width 16, 2 heads, 2 blocks,
//! context 8) loads the weights PyTorch saved (`scripts/gpt_interop.py` wrote the fixtures
//! from `scripts/gpt_torch.py`), and its logits, loss and every gradient match what PyTorch
//! computed in float64 from the same weights.

use rtx_core::prelude::*;
use safetensors::{Dtype, SafeTensors};

#[model]
pub struct TinyAttention {
    q: Linear<16, 16>,
    k: Linear<16, 16>,
    v: Linear<16, 16>,
    proj: Linear<16, 16>,
}

#[model]
impl TinyAttention {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 16]) -> [B, T, 16] {
            let q = split_heads(self.q(x), 2);
            let k = split_heads(self.k(x), 2);
            let v = split_heads(self.v(x), 2);
            self.proj(merge_heads(attention(q, k, v, causal = true)))
        }
    }
}

#[model]
pub struct TinyMlp {
    fc: Linear<16, 64>,
    proj: Linear<64, 16>,
}

#[model]
impl TinyMlp {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 16]) -> [B, T, 16] {
            self.proj(gelu_tanh(self.fc(x)))
        }
    }
}

#[model]
pub struct TinyBlock {
    ln1: LayerNorm<16>,
    attn: TinyAttention,
    ln2: LayerNorm<16>,
    mlp: TinyMlp,
}

#[model]
impl TinyBlock {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 16]) -> [B, T, 16] {
            let x = x + self.attn(self.ln1(x));
            x + self.mlp(self.ln2(x))
        }
    }
}

#[model]
pub struct TinyGpt {
    wte: Embedding<84, 16>,
    wpe: Embedding<8, 16>,
    blocks: [TinyBlock; 2],
    ln_f: LayerNorm<16>,
    head: Linear<16, 84>,
}

#[model]
impl TinyGpt {
    graph! {
        fn forward<B, T>(&self, idx: i64[B, T]) -> [B, T, 84] {
            let mut x = self.wte(idx) + self.wpe(positions(idx, 1));
            for block in &self.blocks {
                x = block(x);
            }
            self.head(self.ln_f(x))
        }

        fn loss<B, T>(&self, idx: i64[B, T], targets: i64[B, T]) -> [] {
            cross_entropy(self.forward(idx), targets)
        }
    }
}

const WEIGHTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/gpt_tiny.safetensors"
);
const EXPECTED: &[u8] = include_bytes!("fixtures/gpt_tiny_expected.safetensors");

/// Tensor `name` of the expected-values file.
fn expected(name: &str) -> Tensor {
    let st = SafeTensors::deserialize(EXPECTED).unwrap();
    let view = st.tensor(name).unwrap();
    let data = view.data();
    match view.dtype() {
        Dtype::F32 => Tensor::from_vec(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            view.shape(),
        )
        .unwrap(),
        Dtype::I64 => Tensor::from_i64(
            data.chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            view.shape(),
        )
        .unwrap(),
        other => panic!("unexpected dtype {other:?} for {name}"),
    }
}

/// max |got - want| / max |want|.
fn relative_error(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    let scale = w.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let worst = g.iter().zip(&w).fold(0f64, |m, (a, b)| {
        m.max((f64::from(*a) - f64::from(*b)).abs())
    });
    worst / scale.max(f64::MIN_POSITIVE)
}

fn loaded() -> TinyGpt {
    let mut model = TinyGpt::init(99);
    model.load_safetensors(WEIGHTS).unwrap();
    model
}

#[test]
fn pytorch_weights_load_under_the_same_names() {
    let model = loaded();

    assert_eq!(model.named_params().len(), 38);
}

#[test]
fn logits_match_pytorch_within_1e5() {
    let model = loaded();

    let logits = model.forward(&expected("idx")).unwrap();

    let err = relative_error(&logits, &expected("logits"));
    assert!(err < 1e-5, "relative error {err:e}");
}

#[test]
fn loss_and_every_gradient_match_pytorch() {
    let model = loaded();

    let (loss, grads) = model
        .loss_and_grads(&mut Ctx::eval(), &expected("idx"), &expected("targets"))
        .unwrap();

    assert!(relative_error(&loss, &expected("loss")) < 1e-5);
    for (name, _) in model.named_params() {
        let (got, want) = (grads.get(&name).unwrap(), expected(&format!("grad.{name}")));
        // The key biases' gradient is exactly zero (a bias on every key adds the same amount
        // to each query's scores, which softmax ignores): f32 leaves ~1e-9 there, so the
        // error is relative to the largest value or 1e-3, whichever is larger.
        let scale = want
            .to_vec_f32()
            .unwrap()
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        let err = relative_error(got, &want) * f64::from(scale) / f64::from(scale.max(1e-3));
        assert!(err < 1e-4, "gradient of {name}: relative error {err:e}");
    }
}
