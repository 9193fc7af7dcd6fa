//! What the compiled backward pass computes, and what it leaves out: gradients only for what
//! the function returns (parameters; an input only when marked `#[grad]`), no gradient for a
//! data input or a dropout mask, one mask per `dropout` call, and concat along a symbolic axis.

mod common;

use common::Rng;
use models::mlp::Mlp;
use rtx_core::ir::{GraphFn, Op};
use rtx_core::prelude::*;

#[model]
pub struct Probe {
    fc: Linear<3, 2>,
}

#[model]
impl Probe {
    graph! {
        fn loss<B>(&self, #[grad] x: [B, 3], t: [B, 2]) -> [] {
            mse(self.fc(x), t)
        }

        fn twice_dropped<B>(&self, x: [B, 3]) -> [B, 3] {
            dropout(x, 0.5) - dropout(x, 0.5)
        }

        fn joined<B, T, S>(&self, a: [B, T, 3], b: [B, S, 3]) -> [] {
            sum(self.fc(concat([a, b], 1)) * self.fc(concat([a, b], 1)))
        }
    }
}

fn function<'a>(ir: &'a rtx_core::ir::ModelIr, name: &str) -> &'a GraphFn {
    ir.function(name)
        .expect("the model has this graph function")
}

fn backward_ops(f: &GraphFn) -> impl Iterator<Item = &Op> {
    f.graph.nodes[f.forward_len..].iter().map(|n| &n.op)
}

#[test]
fn mlp_backward_has_no_matmul_for_the_data_input() {
    // fc2: dW and the gradient of the hidden layer; fc1: dW only. The gradient of `x` would be
    // a fourth matmul.
    let ir = Mlp::graph().unwrap();
    let loss = function(&ir, "loss");

    let matmuls = backward_ops(loss).filter(|op| **op == Op::MatMul).count();

    assert_eq!(matmuls, 3, "{}", ir.to_text());
}

#[test]
fn mlp_backward_returns_only_parameter_gradients() {
    let ir = Mlp::graph().unwrap();
    let loss = function(&ir, "loss");

    let leaves: Vec<&Op> = loss
        .grads
        .iter()
        .map(|g| &loss.graph.node(g.leaf).op)
        .collect();

    assert_eq!(leaves.len(), 4);
    assert!(leaves.iter().all(|op| matches!(op, Op::Param { .. })));
}

#[test]
fn mlp_backward_differentiates_no_dropout_mask() {
    // `dropout(h) = h * mask`: the backward pass needs `g * mask` for h; `g * h`, the mask's
    // gradient, would be dead work.
    let ir = Mlp::graph().unwrap();
    let loss = function(&ir, "loss");
    let mask = loss
        .graph
        .nodes
        .iter()
        .position(|n| matches!(n.op, Op::DropoutMask { .. }))
        .expect("the MLP has a dropout mask");

    let dropped = loss.graph.nodes[..loss.forward_len]
        .iter()
        .find(|n| n.op == Op::Mul && n.args.contains(&mask))
        .expect("dropout multiplies by its mask");
    let h = dropped
        .args
        .iter()
        .copied()
        .find(|&a| a != mask)
        .unwrap_or(mask);

    let backward_products: Vec<&Vec<usize>> = loss.graph.nodes[loss.forward_len..]
        .iter()
        .filter(|n| n.op == Op::Mul)
        .map(|n| &n.args)
        .collect();
    let reading = |v: usize| backward_products.iter().filter(|a| a.contains(&v)).count();

    assert_eq!(reading(mask), 1, "{}", ir.to_text());
    assert_eq!(
        reading(h),
        0,
        "the mask's gradient g * h is computed: {}",
        ir.to_text()
    );
}

#[test]
fn graph_has_no_unreachable_nodes() {
    let ir = Mlp::graph().unwrap();
    let loss = function(&ir, "loss");
    let mut used = vec![false; loss.graph.len()];
    used[loss.output] = true;
    for g in &loss.grads {
        used[g.leaf] = true;
        if let Some(id) = g.grad {
            used[id] = true;
        }
    }
    for n in &loss.graph.nodes {
        for &a in &n.args {
            used[a] = true;
        }
    }

    let dead: Vec<usize> = (0..used.len()).filter(|&i| !used[i]).collect();

    assert!(dead.is_empty(), "dead nodes {dead:?} in\n{}", ir.to_text());
}

#[test]
fn two_dropout_calls_draw_two_masks() {
    let model = Probe::init(0);
    let ir = Probe::graph().unwrap();
    let masks = function(&ir, "twice_dropped")
        .graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::DropoutMask { .. }))
        .count();
    let x = Rng::new(1).images(&[64, 3]);

    let diff = model
        .twice_dropped_with(&mut Ctx::train(7), &x)
        .unwrap()
        .to_vec_f32()
        .unwrap();

    assert_eq!(masks, 2);
    assert!(
        diff.iter().any(|&v| v != 0.0),
        "two dropout calls gave the same mask"
    );
}

#[test]
fn grad_attribute_returns_the_input_gradient() {
    // loss = mean((x W^T + b - t)^2) over B*2 elements, so dL/dx = 2/(2B) (y - t) W.
    let model = Probe::init(3);
    let mut rng = Rng::new(4);
    let (x, t) = (rng.images(&[5, 3]), rng.images(&[5, 2]));
    let w = model.fc.weight.to_vec_f32().unwrap();
    let b = model.fc.bias.to_vec_f32().unwrap();
    let (xv, tv) = (x.to_vec_f32().unwrap(), t.to_vec_f32().unwrap());

    let (_, grads) = model.loss_and_grads(&mut Ctx::eval(), &x, &t).unwrap();

    let gx = grads.get("x").expect("a gradient for the #[grad] input");
    let got = gx.to_vec_f32().unwrap();
    assert_eq!(gx.shape(), &[5, 3]);
    for r in 0..5 {
        let resid: Vec<f32> = (0..2)
            .map(|o| {
                (0..3).map(|i| xv[r * 3 + i] * w[o * 3 + i]).sum::<f32>() + b[o] - tv[r * 2 + o]
            })
            .collect();
        for i in 0..3 {
            let want: f32 = (0..2).map(|o| resid[o] * w[o * 3 + i]).sum::<f32>() * 2.0 / 10.0;
            assert!(
                (got[r * 3 + i] - want).abs() < 1e-5,
                "row {r} col {i}: {} vs {want}",
                got[r * 3 + i]
            );
        }
    }
    assert!(grads.get("t").is_none(), "`t` is not marked #[grad]");
}

#[test]
fn concat_along_a_symbolic_axis_is_differentiable() {
    // d/dW sum(y*y) with y = concat(a, b) W^T + bias is 2 y^T [a; b]: compare with the split
    // computed by hand.
    let model = Probe::init(5);
    let mut rng = Rng::new(6);
    let (a, b) = (rng.images(&[2, 3, 3]), rng.images(&[2, 4, 3]));

    let (_, grads) = model.joined_and_grads(&mut Ctx::eval(), &a, &b).unwrap();

    let w = model.fc.weight.to_vec_f32().unwrap();
    let bias = model.fc.bias.to_vec_f32().unwrap();
    let (av, bv) = (a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
    let mut want = [0f32; 6];
    for batch in 0..2 {
        let rows = (0..3)
            .map(|t| &av[(batch * 3 + t) * 3..][..3])
            .chain((0..4).map(|s| &bv[(batch * 4 + s) * 3..][..3]));
        for row in rows {
            for o in 0..2 {
                let y: f32 = (0..3).map(|i| row[i] * w[o * 3 + i]).sum::<f32>() + bias[o];
                for i in 0..3 {
                    want[o * 3 + i] += 2.0 * y * row[i];
                }
            }
        }
    }
    let got = grads.get("fc.weight").unwrap().to_vec_f32().unwrap();
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() < 1e-4 * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}
