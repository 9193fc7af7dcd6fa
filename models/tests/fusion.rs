//! The fused schedule computes what the one-kernel-per-node schedule computes, for every
//! model in `models/` and for a model that uses every pointwise op, forward and backward, in
//! eval and train mode; and the fused schedule really fuses.

mod common;

use common::Rng;
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::Classifier;
use rtx_core::ir::Op;
use rtx_core::ir::fusion::{Pointwise as Pw, Step, plan};
use rtx_core::prelude::*;

#[model]
pub struct Pointwise {
    fc: Linear<6, 6>,
}

#[model]
impl Pointwise {
    graph! {
        fn forward<B>(&self, x: [B, 6]) -> [B, 6] {
            let h = self.fc(x);
            let a = gelu(h) * sigmoid(h) - tanh(h) / (exp(neg(h)) + 1.0);
            let b = sqrt(pow(h, 2.0) + 1.0) + log(exp(h) + 2.0);
            relu(a + b) * 0.5 - h
        }

        fn loss<B>(&self, x: [B, 6], t: [B, 6]) -> [] {
            mse(dropout(self.forward(x), 0.2), t)
        }
    }
}

fn assert_close(fused: &Tensor, plain: &Tensor, what: &str) {
    let (f, p) = (fused.to_vec_f32().unwrap(), plain.to_vec_f32().unwrap());
    assert_eq!(fused.shape(), plain.shape(), "{what}: shape");
    for (i, (a, b)) in f.iter().zip(&p).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
            "{what}[{i}]: fused {a} vs unfused {b}"
        );
    }
}

fn assert_grads_close(fused: &Grads, plain: &Grads, names: &[String]) {
    for name in names {
        assert_close(
            fused.get(name).unwrap(),
            plain.get(name).unwrap(),
            &format!("gradient of {name}"),
        );
    }
}

fn param_names<M: Module>(model: &M) -> Vec<String> {
    let mut names = Vec::new();
    model.visit_params("", &mut |name: &str, _: &Tensor| {
        names.push(name.to_string())
    });
    names
}

fn check_classifier<M: Classifier>(batch: usize) {
    let model = M::init(11);
    let mut rng = Rng::new(12);
    let x = rng.images(&M::input_shape(batch));
    let y = rng.labels(batch);
    for train in [false, true] {
        let ctx = |fuse: bool| {
            let c = if train { Ctx::train(5) } else { Ctx::eval() };
            c.with_fusion(fuse)
        };

        let (loss_f, grads_f) = model.loss_and_grads(&mut ctx(true), &x, &y).unwrap();
        let (loss_p, grads_p) = model.loss_and_grads(&mut ctx(false), &x, &y).unwrap();

        assert_close(
            &loss_f,
            &loss_p,
            &format!("{} loss (train {train})", M::NAME),
        );
        assert_grads_close(&grads_f, &grads_p, &param_names(&model));
    }
}

#[test]
fn mlp_fused_and_unfused_agree() {
    check_classifier::<Mlp>(33);
}

#[test]
fn cnn_fused_and_unfused_agree() {
    check_classifier::<Cnn>(9);
}

#[test]
fn every_pointwise_op_fused_and_unfused_agree() {
    let model = Pointwise::init(21);
    let mut rng = Rng::new(22);
    let (x, t) = (rng.images(&[17, 6]), rng.images(&[17, 6]));

    let fwd_f = model
        .forward_with(&mut Ctx::eval().with_fusion(true), &x)
        .unwrap();
    let fwd_p = model
        .forward_with(&mut Ctx::eval().with_fusion(false), &x)
        .unwrap();
    let (loss_f, grads_f) = model
        .loss_and_grads(&mut Ctx::train(3).with_fusion(true), &x, &t)
        .unwrap();
    let (loss_p, grads_p) = model
        .loss_and_grads(&mut Ctx::train(3).with_fusion(false), &x, &t)
        .unwrap();

    assert_close(&fwd_f, &fwd_p, "forward");
    assert_close(&loss_f, &loss_p, "loss");
    assert_grads_close(&grads_f, &grads_p, &param_names(&model));
}

#[test]
fn pointwise_chain_after_a_matmul_is_its_epilogue() {
    // Everything after the matmul of `forward` is pointwise on one shape, bias add included:
    // it runs on the product's tiles, with no pass of its own.
    let ir = Pointwise::graph().unwrap();
    let f = ir.function("forward").unwrap();

    let steps = plan(&f.graph, f.forward_len, &[f.output]);

    // Rounding the operands for mixed precision (`Autocast` of x and of the weight) is a
    // step of its own, which passes the tensor on unchanged at f32.
    assert!(
        !steps.iter().any(|s| matches!(s, Step::Fused { body, .. }
            if !body.iter().all(|i| matches!(i.op, Pw::Autocast | Pw::AutocastGrad)))),
        "{steps:?}"
    );
    let epilogue = steps
        .iter()
        .find(|s| matches!(s, Step::MatMulEpilogue { .. }))
        .expect("a matmul epilogue");
    assert!(matches!(epilogue, Step::MatMulEpilogue { body, .. } if body.len() >= 20));
}

#[test]
fn mlp_step_runs_bias_relu_and_the_relu_gradient_as_matmul_epilogues() {
    let ir = Mlp::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let mut roots = vec![f.output];
    roots.extend(f.grads.iter().filter_map(|g| g.grad));

    let steps = plan(&f.graph, f.graph.len(), &roots);

    let epilogues: Vec<Vec<Pw>> = steps
        .iter()
        .filter_map(|s| match s {
            Step::MatMulEpilogue { body, .. } => Some(
                body.iter()
                    .map(|i| i.op)
                    .filter(|op| !matches!(op, Pw::Autocast | Pw::AutocastGrad))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    // Forward: x @ W1^T + b1, relu. Backward: the upstream gradient through the dropout mask
    // and relu's derivative, right on the tile of dY @ W2.
    assert!(epilogues.contains(&vec![Pw::Add, Pw::Relu]), "{steps:?}");
    assert!(
        epilogues.contains(&vec![Pw::Mul, Pw::ReluGrad]),
        "{steps:?}"
    );
}

#[test]
fn mlp_step_sums_each_bias_gradient_inside_its_weight_gradients_gemm() {
    let ir = Mlp::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let mut roots = vec![f.output];
    roots.extend(f.grads.iter().filter_map(|g| g.grad));

    let steps = plan(&f.graph, f.graph.len(), &roots);

    // fc1 and fc2: dW = dY^T @ x with db = the column sums of dY, one GEMM each.
    let paired: Vec<(usize, usize)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::MatMulRowSums { matmul, sums } => Some((*matmul, *sums)),
            _ => None,
        })
        .collect();
    assert_eq!(paired.len(), 2, "{steps:?}");
    let grad_of = |leaf: &str| {
        let id = f
            .graph
            .nodes
            .iter()
            .position(|n| matches!(&n.op, Op::Param { name, .. } if name == leaf))
            .unwrap();
        f.grads
            .iter()
            .find(|g| g.leaf == id)
            .and_then(|g| g.grad)
            .unwrap()
    };
    for layer in ["fc1", "fc2"] {
        let (dw, db) = (
            grad_of(&format!("{layer}.weight")),
            grad_of(&format!("{layer}.bias")),
        );
        assert!(paired.contains(&(dw, db)), "{layer}: {steps:?}");
    }
}

#[test]
fn a_wrong_shaped_parameter_is_an_error_naming_it() {
    // Weights are public fields and no kernel re-checks shapes: the entry check must catch it.
    let mut model = Pointwise::init(1);
    model.fc.weight = Tensor::zeros(&[6, 5]);
    let x = Rng::new(2).images(&[3, 6]);

    let err = model.forward(&x).unwrap_err();

    assert!(matches!(err, RtxError::ShapeMismatch { .. }), "{err:?}");
    let text = err.to_string();
    for part in ["fc.weight", "[6, 6]", "[6, 5]"] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
}

/// Row reductions over the last axis, forward and backward: a LayerNorm layer, functional
/// `layer_norm`, `softmax` and `log_softmax` (over the last axis and over `T`), and sum /
/// mean / max over the last axis kept as row scalars. `T` is a second
/// symbolic dim, so rows are `[B, T]` and row lengths are literal.
#[model]
pub struct Rows {
    fc: Linear<7, 9>,
    norm: LayerNorm<9>,
    gain: Param1<9>,
    shift: Param1<9>,
}

#[model]
impl Rows {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 7]) -> [B, T, 9] {
            let h = self.norm(self.fc(x));
            let peak = max(h, -1, keepdim);
            let spread = exp(h - peak);
            let share = spread / sum(spread, -1, keepdim);
            let probs = softmax(h, -1) + log_softmax(h, 2) * 0.25 + softmax(h, 1) * 0.5;
            layer_norm(share * 3.0 + h - mean(h, -1, keepdim) + probs, self.gain, self.shift)
        }

        fn loss<B, T>(&self, x: [B, T, 7], t: [B, T, 9]) -> [] {
            mse(self.forward(x), t)
        }
    }
}

#[test]
fn row_reductions_fused_and_unfused_agree() {
    let model = Rows::init(31);
    let mut rng = Rng::new(32);
    let (x, t) = (rng.images(&[5, 3, 7]), rng.images(&[5, 3, 9]));

    let fwd_f = model
        .forward_with(&mut Ctx::eval().with_fusion(true), &x)
        .unwrap();
    let fwd_p = model
        .forward_with(&mut Ctx::eval().with_fusion(false), &x)
        .unwrap();
    let (loss_f, grads_f) = model
        .loss_and_grads(&mut Ctx::eval().with_fusion(true), &x, &t)
        .unwrap();
    let (loss_p, grads_p) = model
        .loss_and_grads(&mut Ctx::eval().with_fusion(false), &x, &t)
        .unwrap();

    assert_close(&fwd_f, &fwd_p, "forward");
    assert_close(&loss_f, &loss_p, "loss");
    assert_grads_close(&grads_f, &grads_p, &param_names(&model));
}

#[test]
fn last_axis_reductions_of_the_forward_pass_all_run_inside_row_kernels() {
    // LayerNorm, the max / exp / sum / divide chain, softmax and log_softmax over the last
    // axis and layer_norm: every reduction over the last axis is part of a row kernel; only
    // the softmax over `T` (axis 1) keeps reduction kernels of its own.
    let ir = Rows::graph().unwrap();
    let f = ir.function("forward").unwrap();

    let steps = plan(&f.graph, f.forward_len, &[f.output]);

    let fused_reductions: usize = steps
        .iter()
        .map(|s| match s {
            Step::Rows { body, .. } => body
                .iter()
                .filter(|i| matches!(i, rtx_core::ir::fusion::RowInstr::Reduce { .. }))
                .count(),
            _ => 0,
        })
        .sum();
    assert!(fused_reductions >= 8, "{steps:?}");
    for s in &steps {
        if let Step::Kernel(id) = s {
            let node = f.graph.node(*id);
            let last = node.shape.len().saturating_sub(1);
            if let Op::Sum { axes, .. } | Op::Mean { axes, .. } | Op::Max { axes, .. } = &node.op {
                assert_ne!(
                    axes,
                    &vec![last],
                    "a last-axis reduction left unfused: {steps:?}"
                );
            }
        }
    }
}

#[test]
fn layer_norm_backward_row_sums_are_row_kernels() {
    let ir = Rows::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let mut roots = vec![f.output];
    roots.extend(f.grads.iter().filter_map(|g| g.grad));

    let steps = plan(&f.graph, f.graph.len(), &roots);

    let backward_rows = steps[..]
        .iter()
        .filter(|s| matches!(s, Step::Rows { outputs, .. } if outputs.iter().any(|&o| o >= f.forward_len)))
        .count();
    assert!(backward_rows >= 1, "{steps:?}");
}

/// A feed-forward block on `[B, T, 7]`: each `Linear` is a 2-D product reshaped back to
/// `[B, T, ..]`, so the backward pass reads products through reshapes (the GELU's gradient
/// reads `dy @ W2` as `[B, T, 12]`, scaled by a row parameter first).
#[model]
pub struct FeedForward {
    fc1: Linear<7, 12>,
    fc2: Linear<12, 7>,
    scale: Param1<12>,
}

#[model]
impl FeedForward {
    graph! {
        fn forward<B, T>(&self, x: [B, T, 7]) -> [B, T, 7] {
            let h = self.fc1(x);
            self.fc2(gelu_tanh(h) * self.scale)
        }

        fn loss<B, T>(&self, x: [B, T, 7], t: [B, T, 7]) -> [] {
            mse(self.forward(x), t)
        }
    }
}

#[test]
fn a_group_reading_a_reshaped_product_is_its_epilogue_and_agrees_with_the_unfused_schedule() {
    let model = FeedForward::init(41);
    let mut rng = Rng::new(42);
    let (x, t) = (rng.images(&[4, 3, 7]), rng.images(&[4, 3, 7]));
    let ir = FeedForward::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let mut roots = vec![f.output];
    roots.extend(f.grads.iter().filter_map(|g| g.grad));

    let steps = plan(&f.graph, f.graph.len(), &roots);
    let (loss_f, grads_f) = model
        .loss_and_grads(&mut Ctx::eval().with_fusion(true), &x, &t)
        .unwrap();
    let (loss_p, grads_p) = model
        .loss_and_grads(&mut Ctx::eval().with_fusion(false), &x, &t)
        .unwrap();

    let through_reshape = steps.iter().any(|s| {
        matches!(s, Step::MatMulEpilogue { matmul, shape_of, .. }
            if f.graph.node(*shape_of).shape.len() == 3 && f.graph.node(*matmul).shape.len() == 2)
    });
    assert!(through_reshape, "{steps:?}");
    assert_close(&loss_f, &loss_p, "loss");
    assert_grads_close(&grads_f, &grads_p, &param_names(&model));
}
