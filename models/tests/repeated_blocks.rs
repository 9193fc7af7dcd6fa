//! Repeated blocks: a field `[Block; N]` holds N blocks with their own parameters, named
//! `blocks.i.` as in PyTorch's `nn.ModuleList`, applied by index or in a `for` loop.

mod common;

use common::{Rng, to_array};
use rtx_core::ir::reference::{self, RefCtx};
use rtx_core::prelude::*;
use std::collections::HashMap;

/// A residual block: x + fc2(relu(fc1(x))).
#[model]
pub struct Residual {
    fc1: Linear<4, 8>,
    fc2: Linear<8, 4>,
}

#[model]
impl Residual {
    graph! {
        fn forward<B>(&self, x: [B, 4]) -> [B, 4] {
            x + self.fc2(relu(self.fc1(x)))
        }
    }
}

#[model]
pub struct Stack {
    blocks: [Residual; 3],
    heads: [Linear<4, 4>; 2],
    gains: [Param1<4>; 2],
}

#[model]
impl Stack {
    graph! {
        fn forward<B>(&self, x: [B, 4]) -> [B, 4] {
            let mut h = x;
            for block in &self.blocks {
                h = block(h);
            }
            self.heads[1](self.heads[0](h) * self.gains[0]) + self.gains[1]
        }

        /// The blocks alone.
        fn body<B>(&self, x: [B, 4]) -> [B, 4] {
            let mut h = x;
            for block in self.blocks.iter() {
                let y = block(h);
                h = y;
            }
            h
        }

        /// The same computation with every block written out.
        fn unrolled<B>(&self, x: [B, 4]) -> [B, 4] {
            let h = self.blocks[2](self.blocks[1](self.blocks[0](x)));
            self.heads[1](self.heads[0](h) * self.gains[0]) + self.gains[1]
        }

        fn loss<B>(&self, x: [B, 4], t: [B, 4]) -> [] {
            mse(self.forward(x), t)
        }
    }
}

#[test]
fn repeated_blocks_have_pytorch_module_list_names() {
    let model = Stack::init(1);

    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();

    assert_eq!(
        names,
        [
            "blocks.0.fc1.weight",
            "blocks.0.fc1.bias",
            "blocks.0.fc2.weight",
            "blocks.0.fc2.bias",
            "blocks.1.fc1.weight",
            "blocks.1.fc1.bias",
            "blocks.1.fc2.weight",
            "blocks.1.fc2.bias",
            "blocks.2.fc1.weight",
            "blocks.2.fc1.bias",
            "blocks.2.fc2.weight",
            "blocks.2.fc2.bias",
            "heads.0.weight",
            "heads.0.bias",
            "heads.1.weight",
            "heads.1.bias",
            "gains.0",
            "gains.1",
        ]
    );
}

#[test]
fn each_block_gets_its_own_initial_parameters() {
    let model = Stack::init(2);

    let a = model.blocks[0].fc1.weight.to_vec_f32().unwrap();
    let b = model.blocks[1].fc1.weight.to_vec_f32().unwrap();

    assert_ne!(a, b);
}

#[test]
fn a_loop_over_blocks_equals_the_blocks_applied_by_index() {
    let model = Stack::init(3);
    let x = Rng::new(4).images(&[5, 4]);

    let looped = model.forward(&x).unwrap().to_vec_f32().unwrap();
    let unrolled = model.unrolled(&x).unwrap().to_vec_f32().unwrap();

    assert_eq!(looped, unrolled);
}

#[test]
fn a_loop_over_blocks_applies_each_block_in_order() {
    let model = Stack::init(5);
    let x = Rng::new(6).images(&[3, 4]);

    let got = model.body(&x).unwrap().to_vec_f32().unwrap();

    // Each residual block by hand, in f64, in order.
    let mut h: Vec<f64> = x.to_vec_f32().unwrap().iter().map(|&v| v as f64).collect();
    for block in &model.blocks {
        let w1 = block.fc1.weight.to_vec_f32().unwrap();
        let b1 = block.fc1.bias.to_vec_f32().unwrap();
        let w2 = block.fc2.weight.to_vec_f32().unwrap();
        let b2 = block.fc2.bias.to_vec_f32().unwrap();
        let mut next = h.clone();
        for r in 0..3 {
            let hidden: Vec<f64> = (0..8)
                .map(|o| {
                    let dot: f64 = (0..4).map(|k| w1[o * 4 + k] as f64 * h[r * 4 + k]).sum();
                    (b1[o] as f64 + dot).max(0.0)
                })
                .collect();
            for o in 0..4 {
                let dot: f64 = (0..8).map(|k| w2[o * 8 + k] as f64 * hidden[k]).sum();
                next[r * 4 + o] += b2[o] as f64 + dot;
            }
        }
        h = next;
    }
    for (i, (g, w)) in got.iter().zip(&h).enumerate() {
        assert!((f64::from(*g) - w).abs() < 1e-5, "[{i}] {g} vs {w}");
    }
}

#[test]
fn gradients_through_repeated_blocks_match_the_f64_reference() {
    let model = Stack::init(7);
    let mut rng = Rng::new(8);
    let (x, t) = (rng.images(&[5, 4]), rng.images(&[5, 4]));

    let (loss, grads) = model.loss_and_grads(&mut Ctx::eval(), &x, &t).unwrap();

    let ir = Stack::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let params: HashMap<String, _> = model
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
    let values = reference::run(
        &f.graph,
        &[to_array(&x), to_array(&t)],
        &|n| params.get(n).cloned(),
        &ctx,
    )
    .unwrap();
    let close = |got: &Tensor, want: &[f64], what: &str| {
        for (i, (g, w)) in got.to_vec_f32().unwrap().iter().zip(want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    };
    close(&loss, &values[f.output].data, "loss");
    assert_eq!(grads.len(), 18);
    for g in &f.grads {
        let rtx_core::ir::Op::Param { name, .. } = &f.graph.node(g.leaf).op else {
            continue;
        };
        let id = g.grad.expect("every parameter reaches the loss");
        close(grads.get(name).unwrap(), &values[id].data, name);
    }
}
