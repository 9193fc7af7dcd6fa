//! The training loop is deterministic: the same seed gives bit-identical epoch losses, on any
//! number of threads, a different seed gives different ones, and training learns.

mod common;

use common::{Rng, bits};
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::{Classifier, TrainConfig, train};
use rtx_core::{Ctx, Module};

fn config(epochs: usize, seed: u64) -> TrainConfig {
    TrainConfig {
        epochs: Some(epochs),
        seed,
        progress: false,
        verbose: false,
        precision: rtx_core::Precision::F32,
        device: rtx_core::Device::Cpu,
    }
}

/// The epoch losses of a fresh training run, as bit patterns.
fn loss_bits<M: Classifier>(epochs: usize, seed: u64) -> Vec<u32> {
    run_bits::<M>(epochs, seed).0
}

/// The epoch losses and the final test accuracy of a fresh training run, as bit patterns.
fn run_bits<M: Classifier>(epochs: usize, seed: u64) -> (Vec<u32>, u64) {
    let (_, report) = train::<M>(&config(epochs, seed)).unwrap();
    assert_eq!(report.epoch_losses.len(), epochs);
    (
        report.epoch_losses.iter().map(|l| l.to_bits()).collect(),
        report.test_accuracy.to_bits(),
    )
}

fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

#[test]
fn same_seed_gives_bit_identical_epoch_losses() {
    assert_eq!(loss_bits::<Mlp>(2, 3), loss_bits::<Mlp>(2, 3));
}

#[test]
fn different_seed_gives_different_epoch_losses() {
    assert_ne!(loss_bits::<Mlp>(2, 3), loss_bits::<Mlp>(2, 4));
}

#[test]
fn epoch_losses_do_not_depend_on_the_thread_count() {
    let one = on_threads(1, || run_bits::<Mlp>(2, 3));
    let two = on_threads(2, || run_bits::<Mlp>(2, 3));
    assert_eq!(one, two);
}

#[test]
fn large_batch_gradients_do_not_depend_on_the_thread_count() {
    // 600 rows make the hidden layer (600 x 128) large enough for the kernels to split work.
    let model = Mlp::init(5);
    let mut rng = Rng::new(5);
    let (x, y) = (rng.images(&[600, 64]), rng.labels(600));
    let run = || {
        let (loss, grads) = model.loss_and_grads(&mut Ctx::train(5), &x, &y).unwrap();
        let mut out = vec![bits(&loss)];
        out.extend(grads.iter().map(|(_, g)| bits(g)));
        out
    };
    let one = on_threads(1, run);
    let two = on_threads(2, run);
    assert_eq!(one, two);
}

#[test]
fn one_cnn_epoch_brings_the_loss_below_chance() {
    let (_, report) = train::<Cnn>(&config(1, 3)).unwrap();
    let chance = 10f32.ln();
    assert!(
        report.epoch_losses[0] < chance,
        "first-epoch loss {} is not below ln 10 = {chance}",
        report.epoch_losses[0]
    );
}
