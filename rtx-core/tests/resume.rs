//! Training checkpoints (`rtx_core::resume`): parameters, optimizer state and the loop's
//! metadata in one atomically written safetensors file.
//!
//! An optimizer restored from a checkpoint takes the same next step as the one that kept
//! running (bit for bit, so step counts and both moment buffers survive); a weights-only file
//! or a checkpoint of another model is refused and changes nothing; a process killed at
//! random moments while it saves in a loop always leaves a whole, loadable checkpoint.

mod common;

use common::Rng;
use rtx_core::checkpoint::Checkpoint;
use rtx_core::optim::{AdamW, Optimizer, Sgd};
use rtx_core::resume::{TrainingMeta, load_training, save_training};
use rtx_core::{Grads, Linear, Module, Tensor, join_name};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

struct Net {
    fc1: Linear<3, 4>,
    fc2: Linear<4, 2>,
}

impl Module for Net {
    fn init_with(rng: &mut rtx_core::Rng) -> Self {
        Net {
            fc1: Linear::init_with(rng),
            fc2: Linear::init_with(rng),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.fc1.visit_params(&join_name(prefix, "fc1"), f);
        self.fc2.visit_params(&join_name(prefix, "fc2"), f);
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        self.fc1.visit_params_mut(&join_name(prefix, "fc1"), f);
        self.fc2.visit_params_mut(&join_name(prefix, "fc2"), f);
    }
}

/// One parameter of `len` values, all equal to the version being saved (the kill test).
struct Big {
    w: Tensor,
}

impl Module for Big {
    fn init_with(_: &mut rtx_core::Rng) -> Self {
        Big {
            w: Tensor::zeros(&[BIG]),
        }
    }
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join_name(prefix, "w"), &self.w);
    }
    fn visit_params_mut<'a>(&'a mut self, prefix: &str, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        f(&join_name(prefix, "w"), &mut self.w);
    }
}

/// 16 MiB of parameters: a save takes long enough that most kills land inside one.
const BIG: usize = 4 << 20;

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("resume-tests")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn random_grads(rng: &mut Rng, model: &Net) -> Grads {
    let mut g = Grads::new();
    for (name, t) in model.named_params() {
        g.push(name, rng.tensor(t.shape()));
    }
    g
}

fn bits(model: &impl Module) -> Vec<(String, Vec<u32>)> {
    model
        .named_params()
        .into_iter()
        .map(|(n, t)| {
            let v = t.to_vec_f32().unwrap();
            (n, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// Runs `steps` optimizer steps, saves, restores into a fresh model and optimizer from
/// `fresh`, and checks the next step agrees bit for bit with the one that kept running.
fn restored_optimizer_continues_bit_identically<O: Optimizer>(
    test: &str,
    fresh: impl Fn() -> O,
    steps: usize,
) {
    let dir = scratch(test);
    let path = dir.join("train.safetensors");
    let mut rng = Rng::new(7);
    let mut model = Net::init(1);
    let mut opt = fresh();
    for _ in 0..steps {
        let g = random_grads(&mut rng, &model);
        opt.step(&mut model, &g).unwrap();
    }
    let mut meta = TrainingMeta::new();
    meta.set("step", steps);
    save_training(&path, &model, &opt, &meta).unwrap();

    let mut restored = Net::init(99);
    let mut restored_opt = fresh();
    let got = load_training(&path, &mut restored, &mut restored_opt).unwrap();
    assert_eq!(got.get::<usize>("step").unwrap(), steps);
    assert_eq!(bits(&restored), bits(&model), "restored parameters");

    let next = random_grads(&mut rng, &model);
    opt.step(&mut model, &next).unwrap();
    restored_opt.step(&mut restored, &next).unwrap();
    assert_eq!(bits(&restored), bits(&model), "the step after restoring");
}

#[test]
fn adamw_restored_from_a_checkpoint_takes_the_same_next_step() {
    restored_optimizer_continues_bit_identically(
        "adamw",
        || AdamW::new(1e-2).weight_decay(0.1).betas(0.9, 0.99),
        3,
    );
}

#[test]
fn sgd_with_momentum_restored_from_a_checkpoint_takes_the_same_next_step() {
    restored_optimizer_continues_bit_identically("sgd", || Sgd::new(0.1).momentum(0.9), 2);
}

#[test]
fn optimizer_state_uses_pytorch_buffer_names_in_the_parameter_shape() {
    let mut model = Net::init(1);
    let mut opt = AdamW::new(1e-3);
    let g = random_grads(&mut Rng::new(3), &model);
    opt.step(&mut model, &g).unwrap();
    let state = opt.state_tensors().unwrap();
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"fc1.weight.exp_avg"), "{names:?}");
    assert!(names.contains(&"fc1.weight.exp_avg_sq"), "{names:?}");
    assert!(names.contains(&"fc2.bias.step"), "{names:?}");
    let (_, avg) = state
        .iter()
        .find(|(n, _)| n == "fc1.weight.exp_avg")
        .unwrap();
    assert_eq!(avg.shape(), &[4, 3]);
}

#[test]
fn metadata_floats_come_back_exactly() {
    let dir = scratch("meta");
    let path = dir.join("train.safetensors");
    let value = 0.1f64 + 0.2;
    let mut meta = TrainingMeta::new();
    meta.set("sum", value).set("rng", u64::MAX - 3);
    save_training(&path, &Net::init(1), &AdamW::new(1e-3), &meta).unwrap();
    let got = load_training(&path, &mut Net::init(2), &mut AdamW::new(1e-3)).unwrap();
    assert_eq!(got.get::<f64>("sum").unwrap().to_bits(), value.to_bits());
    assert_eq!(got.get::<u64>("rng").unwrap(), u64::MAX - 3);
    let err = got.get::<u64>("missing").unwrap_err().to_string();
    assert!(err.contains("`missing`"), "{err}");
}

#[test]
fn a_weights_only_file_cannot_resume_and_changes_nothing() {
    let dir = scratch("weights_only");
    let path = dir.join("net.safetensors");
    Net::init(1).save_safetensors(&path).unwrap();
    let mut model = Net::init(2);
    let before = bits(&model);
    let err = load_training(&path, &mut model, &mut AdamW::new(1e-3))
        .unwrap_err()
        .to_string();
    assert!(err.contains("training checkpoint"), "{err}");
    assert_eq!(bits(&model), before);
}

#[test]
fn a_training_checkpoint_loads_as_weights() {
    let dir = scratch("as_weights");
    let path = dir.join("train.safetensors");
    let mut model = Net::init(1);
    let mut opt = AdamW::new(1e-3);
    let g = random_grads(&mut Rng::new(5), &model);
    opt.step(&mut model, &g).unwrap();
    save_training(&path, &model, &opt, &TrainingMeta::new()).unwrap();
    let mut weights = Net::init(2);
    weights.load_safetensors(&path).unwrap();
    assert_eq!(bits(&weights), bits(&model));
}

#[test]
fn optimizer_state_of_a_wrong_shape_is_refused_and_changes_nothing() {
    let dir = scratch("wrong_state");
    let path = dir.join("train.safetensors");
    let model = Net::init(1);
    let mut opt = AdamW::new(1e-3);
    let mut m = Net::init(1);
    opt.step(&mut m, &random_grads(&mut Rng::new(5), &model))
        .unwrap();
    // The state of fc1.weight, renamed onto fc2.weight ([2, 4], not [4, 3]).
    let mut state = opt.state_tensors().unwrap();
    for (name, _) in state.iter_mut() {
        if name.starts_with("fc1.weight") {
            *name = name.replace("fc1.weight", "fc2.weight");
        } else if name.starts_with("fc2.weight") {
            *name = name.replace("fc2.weight", "fc1.weight");
        }
    }
    let mut swapped = AdamW::new(1e-3);
    swapped.load_state_tensors(&state).unwrap();
    save_training(&path, &m, &swapped, &TrainingMeta::new()).unwrap();

    let mut target = Net::init(3);
    let before = bits(&target);
    let err = load_training(&path, &mut target, &mut AdamW::new(1e-3))
        .unwrap_err()
        .to_string();
    assert!(err.contains("optimizer.fc1.weight.exp_avg"), "{err}");
    assert!(err.contains("[2, 4]") && err.contains("[4, 3]"), "{err}");
    assert_eq!(bits(&target), before);
}

const CHILD_ENV: &str = "RTX_RESUME_KILL_TEST_PATH";

/// Saves versions 1, 2, 3, ... of `Big` (every value equal to the version) to the path in
/// `CHILD_ENV`, printing `saved N` after each, until it is killed. Only meaningful as the
/// child process of the kill test, which starts it with that variable set.
#[test]
#[ignore = "the child process of kill_during_a_save_leaves_the_previous_checkpoint_loadable"]
fn child_saves_checkpoints_until_killed() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let opt = AdamW::new(1e-3);
    for version in 1u64.. {
        let model = Big {
            w: Tensor::full(&[BIG], version as f32),
        };
        let mut meta = TrainingMeta::new();
        meta.set("version", version);
        save_training(&path, &model, &opt, &meta).unwrap();
        println!("saved {version}");
    }
}

#[test]
fn kill_during_a_save_leaves_the_previous_checkpoint_loadable() {
    let dir = scratch("kill");
    let path = dir.join("train.safetensors");
    let tmp = dir.join(".train.safetensors.tmp");
    let mut interrupted = 0;
    for round in 0..8u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "child_saves_checkpoints_until_killed",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait for one complete save of this round, then kill at a varying moment.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let confirmed: u64 = loop {
            let line = lines
                .next()
                .expect("the child stopped before saving")
                .unwrap();
            if let Some(v) = line.strip_prefix("saved ") {
                break v.parse().unwrap();
            }
        };
        if round % 2 == 0 {
            // At a moment that varies from round to round.
            std::thread::sleep(Duration::from_millis(3 + 11 * round));
        } else {
            // As soon as the next save has started writing its file.
            let started = std::time::Instant::now();
            while !tmp.exists() && started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if tmp.exists() {
            interrupted += 1;
        }

        let mut model = Big::init(0);
        let meta = load_training(&path, &mut model, &mut AdamW::new(1e-3))
            .unwrap_or_else(|e| panic!("round {round}: the checkpoint does not load: {e}"));
        let version: u64 = meta.get("version").unwrap();
        assert!(
            version >= confirmed,
            "round {round}: lost version {confirmed}"
        );
        let values = model.w.to_vec_f32().unwrap();
        assert!(
            values.iter().all(|&v| v == version as f32),
            "round {round}: the parameters are not all from version {version}"
        );
    }
    eprintln!("{interrupted} of 8 kills landed inside a save");
    // The rounds above mean something only if some kills landed inside a save.
    assert!(
        interrupted > 0,
        "no kill interrupted a save (no temporary file was ever left behind)"
    );
}
