//! Learning-rate schedules and gradient clipping, against their closed forms.

use rtx_core::schedule::{Constant, Cosine, LinearWarmup, Schedule, WarmupCosine, clip_grad_norm};
use rtx_core::{Grads, Tensor};

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn constant_is_the_same_at_every_step() {
    assert_eq!(Constant(0.1).lr(0), 0.1);
    assert_eq!(Constant(0.1).lr(10_000), 0.1);
}

#[test]
fn linear_warmup_rises_to_the_base_then_holds() {
    let s = LinearWarmup {
        base: 1e-3,
        warmup: 4,
    };
    let got: Vec<f32> = (0..6).map(|i| s.lr(i)).collect();
    let want = [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3];
    assert!(got.iter().zip(want).all(|(g, w)| close(*g, w)), "{got:?}");
}

#[test]
fn cosine_decays_from_base_to_min_like_cosine_annealing() {
    let s = Cosine {
        base: 1.0,
        min: 0.1,
        steps: 10,
    };
    assert!(close(s.lr(0), 1.0));
    // eta_min + (eta_max - eta_min) * (1 + cos(pi * t / T)) / 2 at t = 5 of 10: the midpoint.
    assert!(close(s.lr(5), 0.55));
    assert!(close(s.lr(10), 0.1));
    assert!(close(s.lr(50), 0.1), "holds at min after the end");
}

#[test]
fn warmup_then_cosine_joins_the_two_at_the_base() {
    let s = WarmupCosine {
        base: 2.0,
        min: 0.0,
        warmup: 2,
        steps: 12,
    };
    assert!(close(s.lr(0), 1.0));
    assert!(close(s.lr(1), 2.0));
    assert!(close(s.lr(2), 2.0), "the cosine starts at the base");
    assert!(close(s.lr(7), 1.0), "halfway through the 10 decay steps");
    assert!(close(s.lr(12), 0.0));
}

fn grads(values: &[(&'static str, Vec<f32>)]) -> Grads {
    let mut g = Grads::new();
    for (name, v) in values {
        g.push(*name, Tensor::from_vec(v.clone(), &[v.len()]).unwrap());
    }
    g
}

#[test]
fn clipping_scales_every_gradient_to_the_max_global_norm() {
    // Global norm of (3, 4) and (12): 13.
    let mut g = grads(&[("a", vec![3.0, 4.0]), ("b", vec![12.0])]);
    let total = clip_grad_norm(&mut g, 1.3).unwrap();
    assert!(close(total, 13.0));
    let scale = 1.3 / (13.0 + 1e-6);
    assert_eq!(
        g.get("a").unwrap().to_vec_f32().unwrap(),
        vec![3.0 * scale, 4.0 * scale]
    );
    assert_eq!(
        g.get("b").unwrap().to_vec_f32().unwrap(),
        vec![12.0 * scale]
    );
}

#[test]
fn clipping_leaves_gradients_under_the_norm_alone() {
    let mut g = grads(&[("a", vec![0.3, 0.4])]);
    let total = clip_grad_norm(&mut g, 1.0).unwrap();
    assert!(close(total, 0.5));
    assert_eq!(g.get("a").unwrap().to_vec_f32().unwrap(), vec![0.3, 0.4]);
}

#[test]
fn a_non_finite_norm_is_returned_and_changes_nothing() {
    let mut g = grads(&[("a", vec![f32::INFINITY, 1.0])]);
    let total = clip_grad_norm(&mut g, 1.0).unwrap();
    assert!(total.is_infinite());
    assert_eq!(g.get("a").unwrap().to_vec_f32().unwrap()[1], 1.0);
}

#[test]
fn clipping_needs_a_positive_max_norm() {
    let mut g = grads(&[("a", vec![1.0])]);
    assert!(clip_grad_norm(&mut g, 0.0).is_err());
    assert!(clip_grad_norm(&mut g, f32::NAN).is_err());
}
