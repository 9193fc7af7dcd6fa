//! Dynamic loss scaling (`LossScaler`) and the context's precision settings.

use rtx_core::{Ctx, Grads, LossScaler, Precision, Tensor};

fn grads_of(values: &[f32]) -> Grads {
    let mut g = Grads::new();
    g.push(
        "w",
        Tensor::from_vec(values.to_vec(), &[values.len()]).unwrap(),
    );
    g
}

#[test]
fn a_new_scaler_starts_at_pytorchs_default_scale() {
    assert_eq!(LossScaler::new().scale(), 65536.0);
}

#[test]
fn an_overflowed_gradient_skips_the_step_and_halves_the_scale() {
    let mut scaler = LossScaler::new();

    let take = scaler.update(&grads_of(&[1.0, f32::INFINITY])).unwrap();

    assert!(!take);
    assert_eq!(scaler.scale(), 32768.0);
    assert_eq!(scaler.skipped_steps(), 1);
}

#[test]
fn a_nan_gradient_counts_as_an_overflow() {
    let mut scaler = LossScaler::new();

    assert!(!scaler.update(&grads_of(&[f32::NAN])).unwrap());
}

#[test]
fn the_scale_doubles_after_the_growth_interval_without_overflow() {
    let mut scaler = LossScaler::new().with_growth_interval(3).unwrap();
    let finite = grads_of(&[0.5, -2.0]);

    for _ in 0..2 {
        assert!(scaler.update(&finite).unwrap());
    }
    assert_eq!(scaler.scale(), 65536.0, "not yet: two of three steps");
    assert!(scaler.update(&finite).unwrap());

    assert_eq!(scaler.scale(), 131072.0);
    assert_eq!(scaler.skipped_steps(), 0);
}

#[test]
fn an_overflow_restarts_the_count_towards_growth() {
    let mut scaler = LossScaler::new().with_growth_interval(2).unwrap();
    let finite = grads_of(&[1.0]);

    scaler.update(&finite).unwrap();
    scaler.update(&grads_of(&[f32::INFINITY])).unwrap();
    scaler.update(&finite).unwrap();

    assert_eq!(scaler.scale(), 32768.0, "halved once, not yet grown back");
}

#[test]
fn a_loss_scale_that_is_not_a_power_of_two_is_refused() {
    for bad in [3.0f32, 0.0, -2.0, f32::NAN, f32::INFINITY] {
        let err = Ctx::eval().set_loss_scale(bad).unwrap_err();
        assert!(err.to_string().contains("power of two"), "{err}");
        assert!(LossScaler::new().with_initial_scale(bad).is_err());
    }
}

#[test]
fn prepare_puts_the_scale_into_the_context() {
    let scaler = LossScaler::new().with_initial_scale(1024.0).unwrap();
    let mut ctx = Ctx::train(0).with_precision(Precision::F16);

    scaler.prepare(&mut ctx).unwrap();

    assert_eq!(ctx.loss_scale(), 1024.0);
    assert_eq!(ctx.precision(), Precision::F16);
}

#[test]
fn the_state_round_trips() {
    let mut scaler = LossScaler::new();
    scaler.update(&grads_of(&[f32::INFINITY])).unwrap();
    scaler.update(&grads_of(&[1.0])).unwrap();
    let (scale, good, skipped) = scaler.state();

    let mut restored = LossScaler::new();
    restored.set_state(scale, good, skipped).unwrap();

    assert_eq!(restored, scaler);
}
