//! Whole-model checks of the code `graph!` generates for the MLP and the CNN.
//!
//! (a) The compiled `loss_and_grads` agrees bit for bit with the IR executor running the
//!     model's own graph (`Model::graph()`), in eval and in train mode (dropout on).
//! (b) The backward nodes of that graph, evaluated by the float64 reference, agree with
//!     central finite differences of the float64 loss; and the compiled f32 gradients agree
//!     with those float64 gradients.
//! (c) Wrong inputs at run time are `Err`s that name what was expected and what came.
//! (d) The graph IR serializes, prints and rejects a version it does not know.

mod common;

use common::{Rng, bits, to_array};
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::Classifier;
use rtx_core::exec::run_graph;
use rtx_core::ir::reference::{self, Array, RefCtx};
use rtx_core::ir::{GraphFn, IR_VERSION, ModelIr, Op};
use rtx_core::{Ctx, Module, RtxError, Tensor};
use std::collections::HashMap;

const BATCH: usize = 5;

/// A model with fresh random parameters and a random batch for it.
fn setup<M: Classifier>(seed: u64) -> (M, Tensor, Tensor) {
    let model = M::init(seed);
    let mut rng = Rng::new(seed ^ 0xDA7A);
    let x = rng.images(&M::input_shape(BATCH));
    let y = rng.labels(BATCH);
    (model, x, y)
}

fn loss_fn(ir: &ModelIr) -> &GraphFn {
    ir.function("loss")
        .expect("the model IR has a `loss` function")
}

/// The name of each parameter leaf with a gradient in `f`, and the node holding the gradient.
fn param_grads(f: &GraphFn) -> Vec<(String, Option<usize>)> {
    f.grads
        .iter()
        .filter_map(|g| match &f.graph.node(g.leaf).op {
            Op::Param { name, .. } => Some((name.clone(), g.grad)),
            _ => None,
        })
        .collect()
}

/// Loss and parameter gradients of `loss` run node by node by the IR executor.
fn executor_loss_and_grads<M: Module>(
    model: &M,
    ir: &ModelIr,
    ctx: &mut Ctx,
    x: &Tensor,
    y: &Tensor,
) -> (Tensor, Vec<(String, Tensor)>) {
    let f = loss_fn(ir);
    let params: HashMap<String, Tensor> = model.named_params().into_iter().collect();
    let values = run_graph(
        f,
        &[x, y],
        &|n| params.get(n).cloned(),
        &HashMap::new(),
        ctx,
    )
    .unwrap();
    let grads = param_grads(f)
        .into_iter()
        .map(|(name, id)| {
            let g = match id {
                Some(id) => values[id].contiguous(),
                None => Tensor::zeros(params[&name].shape()),
            };
            (name, g)
        })
        .collect();
    (values[f.output].clone(), grads)
}

fn assert_compiled_matches_executor<M: Classifier>(ir: &ModelIr, seed: u64, train: bool) {
    let (model, x, y) = setup::<M>(seed);
    let ctx = || if train { Ctx::train(seed) } else { Ctx::eval() };
    let (loss, grads) = rtx_core::Model::loss_and_grads(&model, &mut ctx(), &x, &y).unwrap();
    let (exec_loss, exec_grads) = executor_loss_and_grads(&model, ir, &mut ctx(), &x, &y);
    assert_eq!(
        bits(&loss),
        bits(&exec_loss),
        "loss: compiled {:?}, executor {:?}",
        loss,
        exec_loss
    );
    if train {
        let (eval_loss, _) =
            rtx_core::Model::loss_and_grads(&model, &mut Ctx::eval(), &x, &y).unwrap();
        assert_ne!(
            bits(&eval_loss),
            bits(&loss),
            "test setup: dropout should change the training-mode loss"
        );
    }
    let names: Vec<&str> = grads.iter().map(|(n, _)| n).collect();
    let exec_names: Vec<&str> = exec_grads.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, exec_names, "gradient names");
    let model_names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names, model_names,
        "every parameter has a gradient, in the model's order"
    );
    for ((name, g), (_, eg)) in grads.iter().zip(&exec_grads) {
        assert_eq!(g.shape(), eg.shape(), "gradient of {name}: shape");
        assert!(
            bits(g) == bits(eg),
            "gradient of {name} differs (max abs diff {})",
            g.max_abs_diff(eg).unwrap()
        );
    }
}

// --- (a) compiled code vs IR executor -----------------------------------------------------------

#[test]
fn mlp_compiled_loss_and_grads_match_the_ir_executor_in_eval_mode() {
    assert_compiled_matches_executor::<Mlp>(&Mlp::graph().unwrap(), 1, false);
}

#[test]
fn mlp_compiled_loss_and_grads_match_the_ir_executor_with_dropout_on() {
    assert_compiled_matches_executor::<Mlp>(&Mlp::graph().unwrap(), 2, true);
}

#[test]
fn cnn_compiled_loss_and_grads_match_the_ir_executor_in_eval_mode() {
    assert_compiled_matches_executor::<Cnn>(&Cnn::graph().unwrap(), 3, false);
}

#[test]
fn cnn_compiled_loss_and_grads_match_the_ir_executor_with_dropout_on() {
    assert_compiled_matches_executor::<Cnn>(&Cnn::graph().unwrap(), 4, true);
}

// --- (b) gradient check against the float64 reference ---------------------------------------------

/// The model's parameters widened to f64, by name.
fn f64_params<M: Module>(model: &M) -> HashMap<String, Array> {
    model
        .named_params()
        .into_iter()
        .map(|(n, t)| (n, to_array(&t)))
        .collect()
}

/// Evaluates the whole `loss` graph (forward and backward nodes) in f64, eval mode.
fn reference_values(f: &GraphFn, params: &HashMap<String, Array>, inputs: &[Array]) -> Vec<Array> {
    reference_values_in(f, params, inputs, false, 0)
}

/// The same, in train mode with dropout seed stream `seed` when `train`.
fn reference_values_in(
    f: &GraphFn,
    params: &HashMap<String, Array>,
    inputs: &[Array],
    train: bool,
    seed: u64,
) -> Vec<Array> {
    let env = HashMap::new();
    reference::run(
        &f.graph,
        inputs,
        &|n| params.get(n).cloned(),
        &RefCtx {
            env: &env,
            train,
            autocast: rtx_core::ir::AutocastMode::OFF,
            seed,
        },
    )
    .unwrap_or_else(|e| panic!("reference run of `loss` failed: {e}"))
}

fn reference_loss(f: &GraphFn, params: &HashMap<String, Array>, inputs: &[Array]) -> f64 {
    let v = &reference_values(f, params, inputs)[f.output];
    assert!(
        v.shape.is_empty(),
        "loss must be a scalar, found shape {:?}",
        v.shape
    );
    v.data[0]
}

/// The float64 gradient of every parameter from the graph's backward nodes.
fn reference_grads(
    f: &GraphFn,
    params: &HashMap<String, Array>,
    inputs: &[Array],
) -> HashMap<String, Array> {
    let values = reference_values(f, params, inputs);
    param_grads(f)
        .into_iter()
        .map(|(name, id)| {
            let g = match id {
                Some(id) => values[id].clone(),
                None => Array::zeros(params[&name].shape.clone()),
            };
            (name, g)
        })
        .collect()
}

/// Central finite differences of the f64 loss at ~30 random parameter entries spread over
/// every parameter, against the reference-evaluated backward graph.
fn assert_backward_graph_matches_finite_differences<M: Classifier>(ir: &ModelIr, seed: u64) {
    const EPS: f64 = 1e-6;
    const SAMPLES: usize = 30;
    let (model, x, y) = setup::<M>(seed);
    let f = loss_fn(ir);
    let inputs = [to_array(&x), to_array(&y)];
    let params = f64_params(&model);
    let grads = reference_grads(f, &params, &inputs);
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    let mut rng = Rng::new(seed ^ 0xFD);
    for s in 0..SAMPLES {
        let name = &names[s % names.len()];
        let i = rng.below(params[name].data.len());
        let at = |delta: f64| {
            let mut p = params.clone();
            p.get_mut(name).unwrap().data[i] += delta;
            reference_loss(f, &p, &inputs)
        };
        let numeric = (at(EPS) - at(-EPS)) / (2.0 * EPS);
        let analytic = grads[name].data[i];
        let err = (analytic - numeric).abs();
        assert!(
            err <= 1e-7 + 1e-5 * analytic.abs().max(numeric.abs()),
            "d loss / d {name}[{i}]: backward graph {analytic:e}, finite differences {numeric:e} (error {err:e})"
        );
    }
}

/// The compiled f32 gradients against the float64 reference gradients, element by element,
/// relative 1e-3 (elements far below the tensor's largest are held to 1e-3 of 1% of it).
fn assert_compiled_grads_match_reference<M: Classifier>(ir: &ModelIr, seed: u64) {
    let (model, x, y) = setup::<M>(seed);
    let f = loss_fn(ir);
    let inputs = [to_array(&x), to_array(&y)];
    let params = f64_params(&model);
    let want = reference_grads(f, &params, &inputs);
    let want_loss = reference_loss(f, &params, &inputs);
    let (loss, grads) = rtx_core::Model::loss_and_grads(&model, &mut Ctx::eval(), &x, &y).unwrap();
    let loss = loss.item().unwrap() as f64;
    assert!(
        (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "loss: compiled {loss}, reference {want_loss}"
    );
    assert_eq!(grads.len(), want.len(), "number of parameter gradients");
    for (name, g) in grads.iter() {
        let w = &want[name];
        assert_eq!(g.shape(), w.shape.as_slice(), "gradient of {name}: shape");
        let scale = w.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(
            scale > 0.0,
            "gradient of {name} is all zeros: the check would be vacuous"
        );
        for (i, (&c, &r)) in g.to_vec_f32().unwrap().iter().zip(&w.data).enumerate() {
            let err = (c as f64 - r).abs();
            assert!(
                err <= 1e-3 * r.abs().max(1e-2 * scale),
                "gradient of {name}[{i}]: compiled {c:e}, reference {r:e} (error {err:e})"
            );
        }
    }
}

#[test]
fn cnn_train_mode_loss_with_dropout_matches_the_reference_with_the_same_seed() {
    let (model, x, y) = setup::<Cnn>(21);
    let ir = Cnn::graph().unwrap();
    let f = loss_fn(&ir);
    let inputs = [to_array(&x), to_array(&y)];
    let want = reference_values_in(f, &f64_params(&model), &inputs, true, 77)[f.output].data[0];
    let eval = reference_values_in(f, &f64_params(&model), &inputs, false, 77)[f.output].data[0];
    let (loss, _) = rtx_core::Model::loss_and_grads(&model, &mut Ctx::train(77), &x, &y).unwrap();
    let got = loss.item().unwrap() as f64;
    assert!(
        (want - eval).abs() > 1e-6,
        "dropout had no effect on the reference loss; the check would be vacuous"
    );
    assert!(
        (got - want).abs() <= 1e-5 * want.abs(),
        "train-mode loss: compiled {got}, reference {want}"
    );
}

#[test]
fn mlp_backward_graph_matches_finite_differences_of_the_f64_loss() {
    assert_backward_graph_matches_finite_differences::<Mlp>(&Mlp::graph().unwrap(), 5);
}

#[test]
fn mlp_compiled_f32_gradients_match_the_f64_reference() {
    assert_compiled_grads_match_reference::<Mlp>(&Mlp::graph().unwrap(), 6);
}

#[test]
fn cnn_backward_graph_matches_finite_differences_of_the_f64_loss() {
    assert_backward_graph_matches_finite_differences::<Cnn>(&Cnn::graph().unwrap(), 7);
}

#[test]
fn cnn_compiled_f32_gradients_match_the_f64_reference() {
    assert_compiled_grads_match_reference::<Cnn>(&Cnn::graph().unwrap(), 8);
}

// --- (c) run-time safety ------------------------------------------------------------------------------

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

#[test]
fn forward_with_a_wrong_feature_size_is_a_shape_mismatch_naming_both_shapes() {
    let model = Mlp::init(9);
    let x = Rng::new(9).images(&[4, 65]);
    let err = model.forward(&x).unwrap_err();
    let RtxError::ShapeMismatch {
        expected, found, ..
    } = &err
    else {
        panic!("expected ShapeMismatch, got {err:?}")
    };
    assert!(expected.contains("[B, 64]"), "expected: {expected}");
    assert!(found.contains("[4, 65]"), "found: {found}");
    assert_mentions(&err.to_string(), &["[B, 64]", "[4, 65]"]);
}

#[test]
fn forward_with_a_wrong_rank_is_a_shape_mismatch_naming_both_shapes() {
    let model = Mlp::init(10);
    let x = Rng::new(10).images(&[4, 8, 8]);
    let err = model.forward(&x).unwrap_err();
    assert!(matches!(err, RtxError::ShapeMismatch { .. }), "{err:?}");
    assert_mentions(&err.to_string(), &["[B, 64]", "[4, 8, 8]"]);
}

#[test]
fn forward_with_integer_input_is_a_dtype_mismatch() {
    let model = Mlp::init(11);
    let x = Tensor::from_i64(vec![1; 4 * 64], &[4, 64]).unwrap();
    let err = model.forward(&x).unwrap_err();
    let RtxError::DTypeMismatch {
        expected, found, ..
    } = &err
    else {
        panic!("expected DTypeMismatch, got {err:?}")
    };
    assert_eq!((expected.as_str(), found.as_str()), ("f32", "i64"));
}

#[test]
fn cnn_forward_with_a_wrong_image_size_is_a_shape_mismatch_naming_both_shapes() {
    let model = Cnn::init(12);
    let x = Rng::new(12).images(&[3, 1, 8, 9]);
    let err = model.forward(&x).unwrap_err();
    assert!(matches!(err, RtxError::ShapeMismatch { .. }), "{err:?}");
    assert_mentions(&err.to_string(), &["[B, 1, 8, 8]", "[3, 1, 8, 9]"]);
}

#[test]
fn labels_of_another_batch_size_are_a_shape_mismatch_naming_the_bound_symbol() {
    let model = Mlp::init(13);
    let mut rng = Rng::new(13);
    let (x, y) = (rng.images(&[4, 64]), rng.labels(5));
    let err = model.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap_err();
    assert!(matches!(err, RtxError::ShapeMismatch { .. }), "{err:?}");
    assert_mentions(
        &err.to_string(),
        &[
            "`y`",
            "Mlp::loss",
            "[B]",
            "B = 4",
            "[5]",
            "bound by argument `x`",
        ],
    );
    let err = model.loss(&x, &y).unwrap_err();
    assert_mentions(&err.to_string(), &["B = 4"]);
}

#[test]
fn labels_out_of_range_are_an_index_error() {
    let model = Mlp::init(14);
    let x = Rng::new(14).images(&[3, 64]);
    for bad in [10, -1] {
        let y = Tensor::from_i64(vec![2, bad, 7], &[3]).unwrap();
        let err = model.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap_err();
        let RtxError::IndexOutOfRange {
            index,
            value,
            limit,
            ..
        } = err
        else {
            panic!("expected IndexOutOfRange, got {err:?}")
        };
        assert_eq!((index, value, limit), (1, bad, 10));
    }
}

// --- (d) the graph IR ------------------------------------------------------------------------------------

#[test]
fn mlp_graph_round_trips_through_json() {
    let ir = Mlp::graph().unwrap();
    let back = ModelIr::from_json(&ir.to_json().unwrap()).unwrap();
    assert_eq!(back, ir);
}

#[test]
fn mlp_graph_has_a_loss_with_backward_nodes_and_parameter_gradients() {
    let ir = Mlp::graph().unwrap();
    let f = loss_fn(&ir);
    assert!(f.forward_len < f.graph.len(), "no backward nodes");
    let names: Vec<String> = param_grads(f).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
}

#[test]
fn mlp_graph_text_lists_matmul_and_the_backward_section() {
    let text = Mlp::graph().unwrap().to_text();
    assert!(text.contains("-- backward --"), "{text}");
    assert!(text.contains("matmul"), "{text}");
}

#[test]
fn mlp_graph_dot_is_a_digraph() {
    assert!(Mlp::graph().unwrap().to_dot().starts_with("digraph"));
}

#[test]
fn ir_of_a_future_version_is_rejected() {
    let mut ir = Mlp::graph().unwrap();
    ir.version = IR_VERSION + 1;
    let err = ModelIr::from_json(&ir.to_json().unwrap()).unwrap_err();
    assert_mentions(&err, &["version", &(IR_VERSION + 1).to_string()]);
}
