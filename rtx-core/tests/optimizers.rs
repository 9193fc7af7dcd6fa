//! Optimizers against PyTorch's update rules, written out step by step in f64.
//!
//! The model is one parameter `w` of three elements. Each test applies three steps with three
//! different gradients (a constant gradient would make Adam's normalized step exactly ±lr and
//! hide a wrong moment) and compares every element after every step with the formulas of the
//! torch.optim documentation (SGD, Adam, AdamW), evaluated in f64 from the same f32 inputs and
//! f32 hyperparameters. Tolerance 1e-6 absolute.

mod common;

use common::Rng;
use rtx_core::optim::{Adam, AdamW, Optimizer, Sgd};
use rtx_core::{Grads, Module, RtxError, Tensor, join_name};

/// A hand-written module with a single parameter `w: [3]`.
struct Tiny {
    w: Tensor,
}

impl Module for Tiny {
    fn init_with(rng: &mut rtx_core::Rng) -> Self {
        Tiny {
            w: Tensor::from_vec((0..3).map(|_| rng.uniform(-1.0, 1.0)).collect(), &[3]).unwrap(),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join_name(prefix, "w"), &self.w);
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        f(&join_name(prefix, "w"), &mut self.w);
    }
}

const STEPS: usize = 3;
const TOL: f64 = 1e-6;

/// Initial parameter values and one gradient per step, all fresh random f32 values.
fn setup(seed: u64) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut rng = Rng::new(seed);
    let p0 = rng.vec(3, -1.0, 1.0);
    let grads = (0..STEPS).map(|_| rng.vec(3, -1.0, 1.0)).collect();
    (p0, grads)
}

fn grads_of(g: &[f32]) -> Grads {
    let mut grads = Grads::new();
    grads.push("w", Tensor::from_vec(g.to_vec(), &[3]).unwrap());
    grads
}

/// Runs `opt` for every gradient and returns the parameter after each step.
fn run(opt: &mut impl Optimizer, p0: &[f32], grads: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let mut model = Tiny {
        w: Tensor::from_vec(p0.to_vec(), &[3]).unwrap(),
    };
    grads
        .iter()
        .map(|g| {
            opt.step(&mut model, &grads_of(g)).unwrap();
            model.w.to_vec_f32().unwrap()
        })
        .collect()
}

fn assert_trajectory(got: &[Vec<f32>], want: &[Vec<f64>], what: &str) {
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        for i in 0..3 {
            let err = (g[i] as f64 - w[i]).abs();
            assert!(
                err <= TOL,
                "{what}: step {} element {i}: got {}, want {} (error {err:e})",
                t + 1,
                g[i],
                w[i]
            );
        }
    }
}

fn f(x: f32) -> f64 {
    x as f64
}

/// torch.optim.SGD, per its documentation:
/// ```text
/// g = grad + weight_decay * p
/// if momentum != 0:
///     b = g                                   (first step)
///     b = momentum * b + (1 - dampening) * g  (later steps)
///     g = g + momentum * b  if nesterov  else  b
/// p = p - lr * g
/// ```
fn sgd_reference(
    p0: &[f32],
    grads: &[Vec<f32>],
    lr: f32,
    momentum: f32,
    dampening: f32,
    nesterov: bool,
    wd: f32,
) -> Vec<Vec<f64>> {
    let (lr, mu, tau, wd) = (f(lr), f(momentum), f(dampening), f(wd));
    let mut p: Vec<f64> = p0.iter().map(|&v| f(v)).collect();
    let mut b: Option<Vec<f64>> = None;
    let mut out = Vec::new();
    for grad in grads {
        let mut g: Vec<f64> = (0..3).map(|i| f(grad[i]) + wd * p[i]).collect();
        if mu != 0.0 {
            let buf = match b.take() {
                None => g.clone(),
                Some(prev) => (0..3).map(|i| mu * prev[i] + (1.0 - tau) * g[i]).collect(),
            };
            g = if nesterov {
                (0..3).map(|i| g[i] + mu * buf[i]).collect()
            } else {
                buf.clone()
            };
            b = Some(buf);
        }
        for i in 0..3 {
            p[i] -= lr * g[i];
        }
        out.push(p.clone());
    }
    out
}

/// torch.optim.Adam and AdamW, per their documentation:
/// ```text
/// Adam:  g = grad + weight_decay * p          AdamW:  p = p - lr * weight_decay * p;  g = grad
/// m = beta1 * m + (1 - beta1) * g
/// v = beta2 * v + (1 - beta2) * g^2
/// m_hat = m / (1 - beta1^t);  v_hat = v / (1 - beta2^t)
/// p = p - lr * m_hat / (sqrt(v_hat) + eps)
/// ```
fn adam_reference(
    p0: &[f32],
    grads: &[Vec<f32>],
    lr: f32,
    betas: (f32, f32),
    eps: f32,
    wd: f32,
    decoupled: bool,
) -> Vec<Vec<f64>> {
    let (lr, b1, b2, eps, wd) = (f(lr), f(betas.0), f(betas.1), f(eps), f(wd));
    let mut p: Vec<f64> = p0.iter().map(|&v| f(v)).collect();
    let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
    let mut out = Vec::new();
    for (step, grad) in grads.iter().enumerate() {
        let t = (step + 1) as i32;
        for i in 0..3 {
            let mut g = f(grad[i]);
            if decoupled {
                p[i] -= lr * wd * p[i];
            } else {
                g += wd * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let v_hat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
        out.push(p.clone());
    }
    out
}

#[test]
fn plain_sgd_follows_pytorch() {
    let (p0, grads) = setup(1);
    let got = run(&mut Sgd::new(0.1), &p0, &grads);
    assert_trajectory(
        &got,
        &sgd_reference(&p0, &grads, 0.1, 0.0, 0.0, false, 0.0),
        "sgd",
    );
}

#[test]
fn sgd_with_momentum_follows_pytorch() {
    let (p0, grads) = setup(2);
    let got = run(&mut Sgd::new(0.1).momentum(0.9), &p0, &grads);
    assert_trajectory(
        &got,
        &sgd_reference(&p0, &grads, 0.1, 0.9, 0.0, false, 0.0),
        "sgd momentum",
    );
}

#[test]
fn sgd_with_momentum_and_dampening_follows_pytorch() {
    let (p0, grads) = setup(3);
    let got = run(&mut Sgd::new(0.1).momentum(0.9).dampening(0.5), &p0, &grads);
    assert_trajectory(
        &got,
        &sgd_reference(&p0, &grads, 0.1, 0.9, 0.5, false, 0.0),
        "sgd dampening",
    );
}

#[test]
fn sgd_with_nesterov_momentum_follows_pytorch() {
    let (p0, grads) = setup(4);
    let got = run(&mut Sgd::new(0.1).momentum(0.9).nesterov(true), &p0, &grads);
    assert_trajectory(
        &got,
        &sgd_reference(&p0, &grads, 0.1, 0.9, 0.0, true, 0.0),
        "sgd nesterov",
    );
}

#[test]
fn sgd_with_weight_decay_follows_pytorch() {
    let (p0, grads) = setup(5);
    let got = run(&mut Sgd::new(0.1).weight_decay(0.05), &p0, &grads);
    assert_trajectory(
        &got,
        &sgd_reference(&p0, &grads, 0.1, 0.0, 0.0, false, 0.05),
        "sgd weight decay",
    );
}

#[test]
fn sgd_with_momentum_and_weight_decay_follows_pytorch() {
    let (p0, grads) = setup(6);
    let got = run(
        &mut Sgd::new(0.05)
            .momentum(0.9)
            .nesterov(true)
            .weight_decay(0.1),
        &p0,
        &grads,
    );
    assert_trajectory(
        &got,
        &sgd_reference(&p0, &grads, 0.05, 0.9, 0.0, true, 0.1),
        "sgd nesterov weight decay",
    );
}

#[test]
fn adam_follows_pytorch() {
    let (p0, grads) = setup(7);
    let got = run(&mut Adam::new(0.01), &p0, &grads);
    assert_trajectory(
        &got,
        &adam_reference(&p0, &grads, 0.01, (0.9, 0.999), 1e-8, 0.0, false),
        "adam",
    );
}

#[test]
fn adam_with_custom_betas_eps_and_l2_weight_decay_follows_pytorch() {
    let (p0, grads) = setup(8);
    let got = run(
        &mut Adam::new(0.02).betas(0.8, 0.99).eps(1e-6).weight_decay(0.1),
        &p0,
        &grads,
    );
    assert_trajectory(
        &got,
        &adam_reference(&p0, &grads, 0.02, (0.8, 0.99), 1e-6, 0.1, false),
        "adam weight decay",
    );
}

#[test]
fn adamw_follows_pytorch_with_its_default_weight_decay() {
    let (p0, grads) = setup(9);
    let got = run(&mut AdamW::new(0.01), &p0, &grads);
    assert_trajectory(
        &got,
        &adam_reference(&p0, &grads, 0.01, (0.9, 0.999), 1e-8, 0.01, true),
        "adamw",
    );
}

#[test]
fn adamw_with_large_weight_decay_follows_pytorch() {
    let (p0, grads) = setup(10);
    let got = run(
        &mut AdamW::new(0.05).betas(0.85, 0.995).weight_decay(0.5),
        &p0,
        &grads,
    );
    assert_trajectory(
        &got,
        &adam_reference(&p0, &grads, 0.05, (0.85, 0.995), 1e-8, 0.5, true),
        "adamw weight decay",
    );
}

#[test]
fn parameters_without_a_gradient_are_left_alone() {
    let (p0, _) = setup(11);
    let mut model = Tiny {
        w: Tensor::from_vec(p0.clone(), &[3]).unwrap(),
    };
    let mut opt = AdamW::new(0.1);
    opt.step(&mut model, &Grads::new()).unwrap();
    assert_eq!(model.w.to_vec_f32().unwrap(), p0);
}

#[test]
fn a_wrongly_shaped_gradient_is_an_error_and_changes_nothing() {
    let (p0, _) = setup(12);
    let mut model = Tiny {
        w: Tensor::from_vec(p0.clone(), &[3]).unwrap(),
    };
    let mut grads = Grads::new();
    grads.push("w", Tensor::from_vec(vec![0.5; 4], &[4]).unwrap());
    let err = Sgd::new(0.1).step(&mut model, &grads).unwrap_err();
    assert!(matches!(err, RtxError::ShapeMismatch { .. }), "{err:?}");
    assert!(
        err.to_string().contains("[3]") && err.to_string().contains("[4]"),
        "{err}"
    );
    assert_eq!(model.w.to_vec_f32().unwrap(), p0);
}

#[test]
fn adam_adds_eps_outside_the_square_root() {
    // Gradients of about 1e-6, the size of eps: eps inside the square root would shrink the
    // step a thousandfold.
    let (p0, grads) = setup(13);
    let tiny: Vec<Vec<f32>> = grads
        .iter()
        .map(|g| g.iter().map(|v| v * 1e-6).collect())
        .collect();
    let got = run(&mut Adam::new(0.01).eps(1e-6), &p0, &tiny);
    assert_trajectory(
        &got,
        &adam_reference(&p0, &tiny, 0.01, (0.9, 0.999), 1e-6, 0.0, false),
        "adam small gradients",
    );
}

#[test]
fn a_parameter_the_model_alone_holds_is_updated_in_place() {
    let (p0, grads) = setup(40);
    let mut model = Tiny {
        w: Tensor::from_vec(p0.clone(), &[3]).unwrap(),
    };
    let before = model.w.f32_parts("test").unwrap().0.as_ptr();

    AdamW::new(0.1)
        .step(&mut model, &grads_of(&grads[0]))
        .unwrap();

    assert_eq!(model.w.f32_parts("test").unwrap().0.as_ptr(), before);
    assert_ne!(model.w.to_vec_f32().unwrap(), p0);
}

#[test]
fn a_parameter_shared_with_another_tensor_is_copied_not_changed_under_it() {
    let (p0, grads) = setup(41);
    let mut model = Tiny {
        w: Tensor::from_vec(p0.clone(), &[3]).unwrap(),
    };
    let kept = model.w.clone();

    Sgd::new(0.5)
        .step(&mut model, &grads_of(&grads[0]))
        .unwrap();

    assert_eq!(
        kept.to_vec_f32().unwrap(),
        p0,
        "the other tensor must keep its values"
    );
    assert_ne!(model.w.to_vec_f32().unwrap(), p0);
}

/// Two parameters large enough for the update to run in parallel pieces (and one small).
struct Wide {
    a: Tensor,
    b: Tensor,
    c: Tensor,
}

impl Wide {
    fn new(seed: u64) -> Wide {
        let mut rng = Rng::new(seed);
        Wide {
            a: Tensor::from_vec(rng.vec(70_000, -1.0, 1.0), &[70_000]).unwrap(),
            b: Tensor::from_vec(rng.vec(50_001, -1.0, 1.0), &[50_001]).unwrap(),
            c: Tensor::from_vec(rng.vec(5, -1.0, 1.0), &[5]).unwrap(),
        }
    }
    fn grads(seed: u64) -> Grads {
        let mut rng = Rng::new(seed);
        let mut grads = Grads::new();
        grads.push(
            "a",
            Tensor::from_vec(rng.vec(70_000, -1.0, 1.0), &[70_000]).unwrap(),
        );
        grads.push(
            "b",
            Tensor::from_vec(rng.vec(50_001, -1.0, 1.0), &[50_001]).unwrap(),
        );
        grads.push("c", Tensor::from_vec(rng.vec(5, -1.0, 1.0), &[5]).unwrap());
        grads
    }
    fn bits(&self) -> Vec<u32> {
        [&self.a, &self.b, &self.c]
            .iter()
            .flat_map(|t| t.to_vec_f32().unwrap())
            .map(f32::to_bits)
            .collect()
    }
}

impl Module for Wide {
    fn init_with(_: &mut rtx_core::Rng) -> Self {
        Wide::new(0)
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join_name(prefix, "a"), &self.a);
        f(&join_name(prefix, "b"), &self.b);
        f(&join_name(prefix, "c"), &self.c);
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        f(&join_name(prefix, "a"), &mut self.a);
        f(&join_name(prefix, "b"), &mut self.b);
        f(&join_name(prefix, "c"), &mut self.c);
    }
}

#[test]
fn multi_tensor_steps_are_bit_identical_on_any_thread_count_and_match_one_at_a_time() {
    // Three AdamW and three Nesterov SGD steps over all parameters in one pass, on 1 and 3
    // threads, and the same steps with the model split into one-parameter views.
    let run_on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut model = Wide::new(7);
            let mut adamw = AdamW::new(1e-2);
            let mut sgd = Sgd::new(0.1).momentum(0.9).nesterov(true);
            for step in 0..3 {
                adamw.step(&mut model, &Wide::grads(10 + step)).unwrap();
                sgd.step(&mut model, &Wide::grads(20 + step)).unwrap();
            }
            model.bits()
        })
    };
    let one = run_on(1);
    assert_eq!(one, run_on(3));

    // The small parameter alone, stepped by its own optimizers, ends where it did above.
    let mut tiny = Tiny {
        w: Wide::new(7).c.clone(),
    };
    let mut adamw = AdamW::new(1e-2);
    let mut sgd = Sgd::new(0.1).momentum(0.9).nesterov(true);
    let only_c = |seed: u64| {
        let mut g = Grads::new();
        g.push("w", Wide::grads(seed).get("c").unwrap().clone());
        g
    };
    for step in 0..3 {
        adamw.step(&mut tiny, &only_c(10 + step)).unwrap();
        sgd.step(&mut tiny, &only_c(20 + step)).unwrap();
    }
    let c_bits: Vec<u32> = tiny
        .w
        .to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(&one[120_001..], &c_bits[..]);
}
