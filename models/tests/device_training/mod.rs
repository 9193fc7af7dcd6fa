//! The model checks every GPU backend runs (`wgpu_training.rs` on wgpu, `cuda_training.rs`
//! on CUDA): compiled models called with tensors on the device run the fusion plan as device
//! kernels, checked against the CPU on fresh random inputs; then the digits MLP is trained
//! on the device. Each check is a function of the device; `device_training_tests!` makes
//! one test per check that opens the device or prints that it was skipped.
#![allow(dead_code)]

use models::mlp::Mlp;
use models::train::{TrainConfig, train};
use rtx_core::prelude::*;

/// One `#[test]` per check, on the device `$open(test_name)` gives (`None`: skipped).
#[macro_export]
macro_rules! device_training_tests {
    ($open:path) => {
        #[test]
        fn the_mlp_forward_pass_matches_the_cpu() {
            if let Some(d) = $open("the_mlp_forward_pass_matches_the_cpu") {
                device_training::the_mlp_forward_pass_matches_the_cpu(&d);
            }
        }
        #[test]
        fn the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on() {
            if let Some(d) = $open("the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on") {
                device_training::the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on(&d);
            }
        }
        #[test]
        fn adam_steps_follow_the_cpu_steps() {
            if let Some(d) = $open("adam_steps_follow_the_cpu_steps") {
                device_training::adam_steps_follow_the_cpu_steps(&d);
            }
        }
        #[test]
        fn inputs_on_two_devices_are_an_error_naming_both() {
            if let Some(d) = $open("inputs_on_two_devices_are_an_error_naming_both") {
                device_training::inputs_on_two_devices_are_an_error_naming_both(&d);
            }
        }
        #[test]
        fn a_label_past_the_class_count_is_an_error_not_a_wrong_loss() {
            if let Some(d) = $open("a_label_past_the_class_count_is_an_error_not_a_wrong_loss") {
                device_training::a_label_past_the_class_count_is_an_error_not_a_wrong_loss(&d);
            }
        }
        #[test]
        fn the_mlp_trains_on_the_digits_to_97_percent() {
            if let Some(d) = $open("the_mlp_trains_on_the_digits_to_97_percent") {
                device_training::the_mlp_trains_on_the_digits_to_97_percent(&d);
            }
        }
        #[test]
        fn the_gpt_loss_and_gradients_match_the_cpu() {
            if let Some(d) = $open("the_gpt_loss_and_gradients_match_the_cpu") {
                device_training::the_gpt_loss_and_gradients_match_the_cpu(&d);
            }
        }
        #[test]
        fn clipping_gradients_gives_the_cpu_norm_and_scale() {
            if let Some(d) = $open("clipping_gradients_gives_the_cpu_norm_and_scale") {
                device_training::clipping_gradients_gives_the_cpu_norm_and_scale(&d);
            }
        }
        #[test]
        fn the_cnn_loss_and_gradients_match_the_cpu() {
            if let Some(d) = $open("the_cnn_loss_and_gradients_match_the_cpu") {
                device_training::the_cnn_loss_and_gradients_match_the_cpu(&d);
            }
        }
        #[test]
        fn gpt_training_steps_follow_the_cpu_and_save_a_loadable_checkpoint() {
            if let Some(d) =
                $open("gpt_training_steps_follow_the_cpu_and_save_a_loadable_checkpoint")
            {
                device_training::gpt_training_steps_follow_the_cpu_and_save_a_loadable_checkpoint(
                    &d,
                );
            }
        }
    };
}

pub fn random(shape: &[usize], rng: &mut Rng) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.normal()).collect(), shape).unwrap()
}

pub fn labels(n: usize, classes: i64, rng: &mut Rng) -> Tensor {
    let y = (0..n)
        .map(|_| (rng.uniform(0.0, classes as f32) as i64).min(classes - 1))
        .collect();
    Tensor::from_i64(y, &[n]).unwrap()
}

/// Largest `|a - b| / (tol_rel * max|b| + 1e-6)`: below 1 passes.
pub fn misfit(a: &Tensor, b: &Tensor, tol_rel: f32) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / (tol_rel * scale + 1e-6))
        .fold(0.0, f32::max)
}

/// `loss_and_grads` of the same model on the CPU and (moved) on `dev`, with one seed (so one
/// dropout mask): the losses agree within `loss_tol` relative, every gradient is on the
/// device and within `grad_tol` (see [`misfit`]), and no op ran on the CPU. Returns the loss
/// and the worst gradient's misfit with its name.
pub fn assert_same_loss_and_grads<M: Model>(
    cpu: &M,
    gpu: &M,
    dev: &Device,
    (x, y): (&Tensor, &Tensor),
    (loss_tol, grad_tol): (f32, f32),
) -> (f32, (f32, String)) {
    let (loss, grads) = cpu.loss_and_grads(&mut Ctx::train(9), x, y).unwrap();
    let (xd, yd) = (x.to(dev).unwrap(), y.to(dev).unwrap());
    let (gloss, ggrads) = gpu.loss_and_grads(&mut Ctx::train(9), &xd, &yd).unwrap();
    let (l, gl) = (loss.item().unwrap(), gloss.item().unwrap());
    assert!((l - gl).abs() < loss_tol * l.abs(), "loss {gl} vs {l}");
    let mut worst = (0.0f32, String::new());
    let mut count = 0;
    let mut off = Vec::new();
    for (name, want) in grads.iter() {
        let got = ggrads.get(name).unwrap();
        assert_eq!(got.device(), *dev, "{name}");
        let m = misfit(got, want, grad_tol);
        if m >= 1.0 {
            off.push(format!("{name}: {m} of the tolerance"));
        }
        if m > worst.0 {
            worst = (m, name.to_string());
        }
        count += 1;
    }
    assert!(off.is_empty(), "gradients differ:\n{}", off.join("\n"));
    assert_eq!(count, cpu.named_params().len(), "a gradient per parameter");
    let moved_to_cpu = rtx_core::gpu::cpu_fallbacks();
    assert!(
        moved_to_cpu.is_empty(),
        "ops run on the CPU: {moved_to_cpu:?}"
    );
    (gl, worst)
}

pub fn the_mlp_forward_pass_matches_the_cpu(dev: &Device) {
    let dev = dev.clone();
    let mut rng = Rng::new(11);
    let cpu = Mlp::init(3);
    let mut gpu = Mlp::init(3);
    gpu.to(&dev).unwrap();
    let x = random(&[37, 64], &mut rng);
    let want = cpu.forward(&x).unwrap();
    let got = gpu.forward(&x.to(&dev).unwrap()).unwrap();
    assert_eq!(got.device(), dev);
    let m = misfit(&got.to(&Device::Cpu).unwrap(), &want, 1e-5);
    assert!(m < 1.0, "logits differ: {m} of the tolerance");
}

pub fn the_mlp_loss_and_gradients_match_the_cpu_with_dropout_on(dev: &Device) {
    let dev = dev.clone();
    let mut rng = Rng::new(12);
    let cpu = Mlp::init(5);
    let mut gpu = Mlp::init(5);
    gpu.to(&dev).unwrap();
    let (x, y) = (random(&[50, 64], &mut rng), labels(50, 10, &mut rng));
    assert_same_loss_and_grads(&cpu, &gpu, &dev, (&x, &y), (1e-5, 1e-4));
}

pub fn adam_steps_follow_the_cpu_steps(dev: &Device) {
    let dev = dev.clone();
    let mut rng = Rng::new(13);
    let mut cpu = Mlp::init(7);
    let mut gpu = Mlp::init(7);
    gpu.to(&dev).unwrap();
    let (mut cpu_opt, mut gpu_opt) = (AdamW::new(1e-2), AdamW::new(1e-2));
    for step in 0..5 {
        let (x, y) = (random(&[32, 64], &mut rng), labels(32, 10, &mut rng));
        let (_, g) = cpu.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap();
        cpu_opt.step(&mut cpu, &g).unwrap();
        let (xd, yd) = (x.to(&dev).unwrap(), y.to(&dev).unwrap());
        let (_, g) = gpu.loss_and_grads(&mut Ctx::eval(), &xd, &yd).unwrap();
        gpu_opt.step(&mut gpu, &g).unwrap();
        for ((name, want), (_, got)) in cpu.named_params().iter().zip(gpu.named_params()) {
            assert_eq!(got.device(), dev);
            let m = misfit(&got, want, 1e-4);
            assert!(m < 1.0, "step {step}, {name}: {m} of the tolerance");
        }
    }
    // The optimizer state reads back from the device under the CPU's names.
    let state = gpu_opt.state_tensors().unwrap();
    let cpu_state = cpu_opt.state_tensors().unwrap();
    assert_eq!(state.len(), cpu_state.len());
    for ((name, got), (_, want)) in state.iter().zip(&cpu_state) {
        if want.dtype() == DType::F32 {
            assert!(misfit(got, want, 1e-3) < 1.0, "{name}");
        }
    }
}

pub fn inputs_on_two_devices_are_an_error_naming_both(dev: &Device) {
    let dev = dev.clone();
    let mut rng = Rng::new(14);
    let model = Mlp::init(1);
    let x = random(&[4, 64], &mut rng).to(&dev).unwrap();
    let y = labels(4, 10, &mut rng);
    let err = model
        .loss_and_grads(&mut Ctx::eval(), &x, &y)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("device mismatch") && err.contains("cpu"),
        "{err}"
    );
    // Parameters left on the CPU with inputs on the device: the error says how to move them.
    let err = model.forward(&x).unwrap_err().to_string();
    assert!(err.contains("model.to(&device)"), "{err}");
}

pub fn a_label_past_the_class_count_is_an_error_not_a_wrong_loss(dev: &Device) {
    let dev = dev.clone();
    let mut rng = Rng::new(15);
    let mut model = Mlp::init(1);
    model.to(&dev).unwrap();
    let x = random(&[3, 64], &mut rng).to(&dev).unwrap();
    let y = Tensor::from_i64(vec![1, 10, 2], &[3])
        .unwrap()
        .to(&dev)
        .unwrap();
    let err = model
        .loss_and_grads(&mut Ctx::eval(), &x, &y)
        .unwrap_err()
        .to_string();
    assert!(err.contains("value 10 at position 1"), "{err}");
}

pub fn the_mlp_trains_on_the_digits_to_97_percent(dev: &Device) {
    let dev = dev.clone();
    let cfg = TrainConfig {
        epochs: None,
        seed: 0,
        progress: false,
        verbose: false,
        precision: Precision::F32,
        device: dev.clone(),
    };
    let (model, report) = train::<Mlp>(&cfg).unwrap();
    eprintln!(
        "MLP on {dev}: test accuracy {:.4} after {} epochs in {:.1} s",
        report.test_accuracy, report.epochs, report.seconds
    );
    assert!(report.test_accuracy >= 0.97, "{report:?}");
    // The trained model came back to the CPU and gives the same accuracy there.
    let acc = models::train::held_out_accuracy(&model).unwrap();
    assert!(
        (acc - report.test_accuracy).abs() < 0.005,
        "{acc} on the cpu"
    );
}

pub fn the_gpt_loss_and_gradients_match_the_cpu(dev: &Device) {
    let dev = dev.clone();
    use models::gpt::Gpt;
    let mut rng = Rng::new(16);
    let cpu = Gpt::init(2);
    let mut gpu = Gpt::init(2);
    gpu.to(&dev).unwrap();
    let tokens = |rng: &mut Rng| {
        let v = (0..2 * 12)
            .map(|_| (rng.uniform(0.0, 84.0) as i64).min(83))
            .collect();
        Tensor::from_i64(v, &[2, 12]).unwrap()
    };
    let (x, y) = (tokens(&mut rng), tokens(&mut rng));
    let (loss, worst) = assert_same_loss_and_grads(&cpu, &gpu, &dev, (&x, &y), (1e-4, 1e-3));
    eprintln!(
        "gpt on {dev}: loss {loss}; worst gradient {} at {:.3} of the tolerance",
        worst.1, worst.0
    );
}

pub fn clipping_gradients_gives_the_cpu_norm_and_scale(dev: &Device) {
    let dev = dev.clone();
    let mut rng = Rng::new(17);
    let cpu = Mlp::init(8);
    let mut gpu = Mlp::init(8);
    gpu.to(&dev).unwrap();
    let (x, y) = (random(&[16, 64], &mut rng), labels(16, 10, &mut rng));
    let (_, mut grads) = cpu.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap();
    let (xd, yd) = (x.to(&dev).unwrap(), y.to(&dev).unwrap());
    let (_, mut ggrads) = gpu.loss_and_grads(&mut Ctx::eval(), &xd, &yd).unwrap();
    let norm = rtx_core::schedule::clip_grad_norm(&mut grads, 0.01).unwrap();
    let gnorm = rtx_core::schedule::clip_grad_norm(&mut ggrads, 0.01).unwrap();
    assert!(
        norm > 0.01,
        "the test needs a norm above the limit, found {norm}"
    );
    assert!((norm - gnorm).abs() < 1e-5 * norm, "norm {gnorm} vs {norm}");
    for (name, want) in grads.iter() {
        let got = ggrads.get(name).unwrap();
        assert_eq!(got.device(), dev, "{name}");
        assert!(misfit(got, want, 1e-4) < 1.0, "{name}");
    }
}

pub fn the_cnn_loss_and_gradients_match_the_cpu(dev: &Device) {
    let dev = dev.clone();
    use models::cnn::Cnn;
    let mut rng = Rng::new(18);
    let cpu = Cnn::init(6);
    let mut gpu = Cnn::init(6);
    gpu.to(&dev).unwrap();
    let (x, y) = (random(&[6, 1, 8, 8], &mut rng), labels(6, 10, &mut rng));
    assert_same_loss_and_grads(&cpu, &gpu, &dev, (&x, &y), (1e-5, 1e-4));
}

pub fn gpt_training_steps_follow_the_cpu_and_save_a_loadable_checkpoint(dev: &Device) {
    let dev = dev.clone();
    use models::train_gpt::{GptConfig, train_gpt_on};
    let stream: Vec<i64> = (0..3000).map(|i| (i * 7 + i / 13) % 84).collect();
    let dir = std::env::temp_dir().join(format!("rtx-device-gpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = GptConfig {
        steps: 3,
        batch: 2,
        eval_every: 3,
        eval_batches: Some(1),
        checkpoint: Some(dir.join("gpu.safetensors")),
        ..GptConfig::default()
    };
    let (_, cpu) = train_gpt_on(&cfg, &stream[..2500], &stream[2500..]).unwrap();
    let on_gpu = GptConfig {
        device: dev.clone(),
        ..cfg.clone()
    };
    let (model, gpu) = train_gpt_on(&on_gpu, &stream[..2500], &stream[2500..]).unwrap();
    assert_eq!(model.named_params()[0].1.device(), Device::Cpu);
    for (step, (c, g)) in cpu.losses.iter().zip(&gpu.losses).enumerate() {
        assert!(
            (c - g).abs() < 1e-4 * c.abs(),
            "step {step}: loss {g} on {dev}, {c} on cpu"
        );
    }
    assert!((cpu.val_loss - gpu.val_loss).abs() < 1e-4 * cpu.val_loss.abs());
    // The checkpoint saved from the device run loads into a model on the device.
    let mut loaded = models::gpt::Gpt::init(9);
    loaded.to(&dev).unwrap();
    let mut opt = AdamW::new(1e-3);
    rtx_core::resume::load_training(dir.join("gpu.safetensors"), &mut loaded, &mut opt).unwrap();
    assert_eq!(loaded.named_params()[0].1.device(), dev);
    let _ = std::fs::remove_dir_all(&dir);
}
