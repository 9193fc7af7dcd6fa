//! The library ops (`silu`, `abs`, `clamp`, `where`, `softplus`, `leaky_relu`, `maximum`,
//! `minimum`, `min`, functional `layer_norm`, `gelu_tanh`, `masked_fill`, `tril`, `triu`, `rms_norm`, `split_heads`, `merge_heads`, `rope`, `argmax`, `top_k`, `top_k_indices`, `positions`) and the
//! comparison operators, written in
//! `graph!`: the compiled f32 forward pass and gradients agree with the float64 reference of
//! the model's own IR.

mod common;

use common::{Rng, to_array};
use rtx_core::ir::reference::{self, Array, RefCtx};
use rtx_core::prelude::*;
use std::collections::HashMap;

#[model]
pub struct Library {
    fc: Linear<5, 6>,
    gain: Param1<6>,
    shift: Param1<6>,
}

#[model]
impl Library {
    graph! {
        fn forward<B>(&self, x: [B, 5]) -> [B, 6] {
            let h = self.fc(x);
            let a = silu(h) + abs(h) * 0.5 - clamp(h, -0.5, 0.5);
            let b = where(h > 0.0, softplus(h), leaky_relu(h, 0.1));
            let c = maximum(a, b) - minimum(a, 0.25) + softplus(h, 2.0) * (h <= 0.3);
            let d = gelu_tanh(c) + masked_fill(c, h > 0.5, -1.0) + tril(c, 1.0) * 0.1 - triu(c) * 0.2;
            let e = merge_heads(split_heads(d, 2) * split_heads(h, 2)) + rope(d, 100.0) * 0.3;
            layer_norm(e, self.gain, self.shift) + rms_norm(d, self.gain) * 0.5
        }

        fn predict<B>(&self, x: [B, 5]) -> [B] {
            argmax(self.forward(x), 1)
        }

        fn loss<B>(&self, x: [B, 5], t: [B, 6]) -> [] {
            let y = self.forward(x);
            mse(y, t) + min(y) * 0.01 + mean(top_k(y, 2)) * 0.1
        }

        fn top_two<B>(&self, x: [B, 5]) -> [B, 2] {
            top_k_indices(self.forward(x), 2)
        }
    }
}

fn reference_values(
    model: &Library,
    name: &str,
    inputs: &[Array],
) -> (Vec<Array>, rtx_core::ir::GraphFn) {
    let ir = Library::graph().unwrap();
    let f = ir.function(name).unwrap().clone();
    let params: HashMap<String, Array> = model
        .named_params()
        .into_iter()
        .map(|(n, t)| (n, to_array(&t)))
        .collect();
    let env = HashMap::new();
    let ctx = RefCtx {
        env: &env,
        train: false,
        autocast: rtx_core::ir::AutocastMode::OFF,
        seed: 0,
    };
    let values = reference::run(&f.graph, inputs, &|n| params.get(n).cloned(), &ctx).unwrap();
    (values, f)
}

fn assert_close(got: &Tensor, want: &Array, what: &str) {
    let got = got.to_vec_f32().unwrap();
    assert_eq!(got.len(), want.data.len(), "{what}: size");
    for (i, (g, w)) in got.iter().zip(&want.data).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{what}[{i}]: {g} vs reference {w}"
        );
    }
}

#[test]
fn library_ops_forward_matches_the_f64_reference() {
    let model = Library::init(3);
    let x = Rng::new(4).images(&[7, 5]);

    let y = model.forward(&x).unwrap();

    let (values, f) = reference_values(&model, "forward", &[to_array(&x)]);
    assert_close(&y, &values[f.output], "forward");
}

#[test]
fn library_ops_gradients_match_the_f64_reference() {
    let model = Library::init(5);
    let mut rng = Rng::new(6);
    let (x, t) = (rng.images(&[7, 5]), rng.images(&[7, 6]));

    let (loss, grads) = model.loss_and_grads(&mut Ctx::eval(), &x, &t).unwrap();

    let (values, f) = reference_values(&model, "loss", &[to_array(&x), to_array(&t)]);
    assert_close(&loss, &values[f.output], "loss");
    for g in &f.grads {
        let rtx_core::ir::Op::Param { name, .. } = &f.graph.node(g.leaf).op else {
            continue;
        };
        let id = g.grad.expect("every parameter reaches the loss");
        assert_close(grads.get(name).unwrap(), &values[id], name);
    }
    assert_eq!(grads.len(), 4, "fc.weight, fc.bias, gain, shift");
}

#[test]
fn top_k_indices_in_a_graph_are_each_rows_two_largest_in_order() {
    let model = Library::init(5);
    let x = Rng::new(6).images(&[7, 5]);

    let ids = model.top_two(&x).unwrap();

    assert_eq!(ids.dtype(), DType::I64);
    let y = model.forward(&x).unwrap().to_vec_f32().unwrap();
    let want: Vec<i64> = y
        .chunks(6)
        .flat_map(|row| {
            let mut order: Vec<usize> = (0..6).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            [order[0] as i64, order[1] as i64]
        })
        .collect();
    assert_eq!(ids.to_vec_i64().unwrap(), want);
}

#[test]
fn argmax_in_a_graph_returns_the_index_of_each_rows_largest_output() {
    let model = Library::init(3);
    let x = Rng::new(4).images(&[7, 5]);

    let ids = model.predict(&x).unwrap();

    assert_eq!(ids.dtype(), DType::I64);
    let y = model.forward(&x).unwrap().to_vec_f32().unwrap();
    let want: Vec<i64> = y
        .chunks(6)
        .map(|row| {
            let best = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            row.iter().position(|&v| v == best).unwrap() as i64
        })
        .collect();
    assert_eq!(ids.to_vec_i64().unwrap(), want);
}

/// Token and learned position embeddings, GPT-2 style.
#[model]
pub struct PositionEmbedding {
    wte: Embedding<10, 4>,
    wpe: Embedding<8, 4>,
}

#[model]
impl PositionEmbedding {
    graph! {
        fn forward<B, T>(&self, idx: i64[B, T]) -> [B, T, 4] {
            self.wte(idx) + self.wpe(positions(idx, 1))
        }
    }
}

#[test]
fn positions_index_a_position_table_by_place_in_the_sequence() {
    let model = PositionEmbedding::init(1);
    let idx = Tensor::from_i64(vec![3, 1, 4, 1, 5, 9], &[2, 3]).unwrap();

    let y = model.forward(&idx).unwrap().to_vec_f32().unwrap();

    let wte = model.wte.weight.to_vec_f32().unwrap();
    let wpe = model.wpe.weight.to_vec_f32().unwrap();
    for (row, &token) in [3usize, 1, 4, 1, 5, 9].iter().enumerate() {
        let t = row % 3;
        for k in 0..4 {
            let want = wte[token * 4 + k] + wpe[t * 4 + k];
            assert!(
                (y[row * 4 + k] - want).abs() < 1e-6,
                "row {row} feature {k}"
            );
        }
    }
}

#[test]
fn a_sequence_longer_than_the_position_table_is_an_error() {
    let model = PositionEmbedding::init(1);
    let idx = Tensor::from_i64(vec![1; 9], &[1, 9]).unwrap();

    let err = model.forward(&idx).unwrap_err();

    assert!(err.to_string().contains("8"), "{err}");
}
