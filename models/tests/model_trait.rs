//! `rtx_core::Model`: `#[model]` implements it for every model with `forward(x)` and a scalar
//! `loss(x, y)`, so one generic training function trains models it has never heard of.

use models::gpt::Gpt;
use models::mlp::Mlp;
use rtx_core::prelude::*;
use rtx_core::train::{mean_loss, train_step};

/// A generic loop: `steps` AdamW steps over `batches` in turn; the loss before and after.
fn fit<M: Model>(seed: u64, batches: &[(Tensor, Tensor)], steps: usize, lr: f32) -> (f32, f32) {
    let mut model = M::init(seed);
    let mut opt = AdamW::new(lr);
    let mut ctx = Ctx::train(seed);
    let before = mean_loss(&model, batches).unwrap();
    for (x, y) in batches.iter().cycle().take(steps) {
        train_step(&mut model, &mut opt, &mut ctx, (x, y), lr, Some(1.0)).unwrap();
    }
    (before, mean_loss(&model, batches).unwrap())
}

fn ints(n: usize, below: i64, seed: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(below as usize) as i64).collect()
}

#[test]
fn one_generic_function_trains_an_mlp() {
    let mut rng = Rng::new(1);
    let batches: Vec<(Tensor, Tensor)> = (0..2)
        .map(|i| {
            let x: Vec<f32> = (0..16 * 64).map(|_| rng.uniform(-1.0, 1.0)).collect();
            (
                Tensor::from_vec(x, &[16, 64]).unwrap(),
                Tensor::from_i64(ints(16, 10, i), &[16]).unwrap(),
            )
        })
        .collect();

    let (before, after) = fit::<Mlp>(0, &batches, 30, 1e-2);

    assert!(after < 0.5 * before, "mlp loss {before} -> {after}");
}

#[test]
fn the_same_function_trains_the_gpt() {
    // A repeating 7-character pattern: easy to learn in a few steps.
    let stream: Vec<i64> = (0..2 * 2 * 16 + 1).map(|i| (i % 7) as i64 * 11).collect();
    let batch = |from: usize| {
        let x = stream[from..from + 32].to_vec();
        let y = stream[from + 1..from + 33].to_vec();
        (
            Tensor::from_i64(x, &[2, 16]).unwrap(),
            Tensor::from_i64(y, &[2, 16]).unwrap(),
        )
    };
    let batches = vec![batch(0), batch(32)];

    let (before, after) = fit::<Gpt>(0, &batches, 20, 3e-3);

    assert!(after < 0.5 * before, "gpt loss {before} -> {after}");
}

#[test]
fn a_non_finite_loss_is_an_error_and_leaves_the_parameters() {
    let mut model = Mlp::init(0);
    let before = model.named_params();
    let x = Tensor::from_vec(vec![f32::NAN; 64], &[1, 64]).unwrap();
    let y = Tensor::from_i64(vec![3], &[1]).unwrap();

    let err = train_step(
        &mut model,
        &mut AdamW::new(1e-3),
        &mut Ctx::train(0),
        (&x, &y),
        1e-3,
        None,
    )
    .unwrap_err()
    .to_string();

    assert!(err.contains("NaN"), "{err}");
    for ((name, a), (_, b)) in before.iter().zip(model.named_params().iter()) {
        assert_eq!(a.max_abs_diff(b).unwrap(), 0.0, "{name} changed");
    }
}
