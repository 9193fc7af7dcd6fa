//! Loading and running IR from JSON never panics: random corruptions of the models' own IR
//! (zero divisors, huge offsets and coefficients, out-of-range axes and node ids, wrong
//! arities) are rejected by `ModelIr::from_json` or fail in `run_graph` with an `RtxError`.

mod common;

use common::Rng;
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::Classifier;
use rtx_core::exec::run_graph;
use rtx_core::ir::ModelIr;
use rtx_core::{Ctx, Tensor};

use serde_json::Value;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The values a corruption writes over a number of the IR.
fn nasty(rng: &mut Rng) -> Value {
    let choices: [Value; 11] = [
        0.into(),
        1.into(),
        (-1).into(),
        3.into(),
        7.into(),
        1000.into(),
        (1u64 << 40).into(),
        i64::MAX.into(),
        i64::MIN.into(),
        u64::MAX.into(),
        Value::from(0.5),
    ];
    choices[rng.below(choices.len())].clone()
}

/// Every number in `v`, as a path of keys and indices.
fn number_paths(v: &Value, path: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::Number(_) => out.push(path.clone()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.into());
                number_paths(item, path, out);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                path.push(k.clone().into());
                number_paths(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn at<'v>(v: &'v mut Value, path: &[Value]) -> &'v mut Value {
    path.iter().fold(v, |v, key| match key {
        Value::String(k) => &mut v[k.as_str()],
        Value::Number(i) => &mut v[i.as_u64().unwrap_or(0) as usize],
        _ => v,
    })
}

/// `rounds` corruptions, or `RTX_FUZZ_ROUNDS` of them when set (for a longer local run).
fn fuzz<M: Classifier>(ir: ModelIr, seed: u64, rounds: usize) {
    let rounds = std::env::var("RTX_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rounds);
    let model = M::init(seed);
    let mut rng = Rng::new(seed);
    let x = rng.images(&M::input_shape(3));
    let y = rng.labels(3);
    let params: HashMap<String, Tensor> = model.named_params().into_iter().collect();
    let json = ir.to_json().unwrap();
    let original: Value = serde_json::from_str(&json).unwrap();
    let mut paths = Vec::new();
    number_paths(&original, &mut Vec::new(), &mut paths);

    for round in 0..rounds {
        let mut v = original.clone();
        for _ in 0..1 + rng.below(3) {
            let path = &paths[rng.below(paths.len())];
            *at(&mut v, path) = nasty(&mut rng);
        }
        let text = v.to_string();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let Ok(ir) = ModelIr::from_json(&text) else {
                return;
            };
            for f in &ir.functions {
                let inputs: Vec<&Tensor> = if f.name == "loss" {
                    vec![&x, &y]
                } else {
                    vec![&x]
                };
                let _ = run_graph(
                    f,
                    &inputs,
                    &|n| params.get(n).cloned(),
                    &HashMap::new(),
                    &mut Ctx::train(round as u64),
                );
            }
        }));
        assert!(
            outcome.is_ok(),
            "round {round}: a corrupted IR panicked instead of returning an error (IR: {}..)",
            &text[..text.len().min(400)]
        );
    }
}

#[test]
fn corrupted_mlp_ir_never_panics() {
    fuzz::<Mlp>(Mlp::graph().unwrap(), 1, 400);
}

#[test]
fn corrupted_cnn_ir_never_panics() {
    fuzz::<Cnn>(Cnn::graph().unwrap(), 2, 200);
}
