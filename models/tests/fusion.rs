//! The fused schedule computes what the one-kernel-per-node schedule computes, for every
//! model in `models/` and for a model that uses every pointwise op, forward and backward, in
//! eval and train mode; and the fused schedule really fuses.

mod common;

use common::Rng;
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::Classifier;
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
fn pointwise_chain_is_one_fused_kernel() {
    // Everything after the matmul of `forward` is pointwise on one shape: bias add included,
    // it is a single pass.
    let ir = Pointwise::graph().unwrap();
    let f = ir.function("forward").unwrap();

    let steps = plan(&f.graph, f.forward_len, &[f.output]);

    let fused: Vec<&Step> = steps
        .iter()
        .filter(|s| matches!(s, Step::Fused { .. }))
        .collect();
    assert_eq!(fused.len(), 1, "{steps:?}");
    assert!(matches!(fused[0], Step::Fused { body, .. } if body.len() >= 20));
}

#[test]
fn mlp_step_fuses_bias_relu_and_the_relu_gradient() {
    let ir = Mlp::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let mut roots = vec![f.output];
    roots.extend(f.grads.iter().filter_map(|g| g.grad));

    let steps = plan(&f.graph, f.graph.len(), &roots);

    let groups: Vec<Vec<Pw>> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Fused { body, .. } => Some(body.iter().map(|i| i.op).collect()),
            Step::Kernel(_) => None,
        })
        .collect();
    assert!(groups.contains(&vec![Pw::Add, Pw::Relu]), "{steps:?}");
    assert!(groups.contains(&vec![Pw::Mul, Pw::ReluGrad]), "{steps:?}");
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
