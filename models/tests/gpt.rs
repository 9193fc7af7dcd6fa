//! The character-level GPT (`models::gpt`): PyTorch-style names, gradients against the float64
//! reference of its own graph, training that lowers the loss and repeats bit for bit.

mod common;

use common::to_array;
use models::corpus::Vocab;
use models::gpt::Gpt;
use models::train_gpt::{GptConfig, train_gpt_on};
use rtx_core::ir::reference::{self, RefCtx};
use rtx_core::prelude::*;
use std::collections::HashMap;

/// A small stream of ids from a fixed text, with the corpus' 84-character vocabulary size.
fn tokens(len: usize) -> Vec<i64> {
    let text = "ROMEO: But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n";
    let vocab = Vocab::of(text);
    let ids = vocab.encode(text).unwrap();
    ids.iter().cycle().take(len).copied().collect()
}

#[test]
fn gpt_parameters_have_pytorch_names() {
    let model = Gpt::init(0);

    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();

    // wte, wpe; per block ln1, q, k, v, proj, ln2, mlp.fc, mlp.proj; ln_f, head.
    assert_eq!(names.len(), 2 + 4 * 16 + 4);
    assert_eq!(names[0], "wte.weight");
    assert!(names.contains(&"blocks.0.attn.q.weight".to_string()));
    assert!(names.contains(&"blocks.3.mlp.proj.bias".to_string()));
    assert_eq!(names.last().unwrap(), "head.bias");
    assert_eq!(model.num_params(), 823_124);
}

#[test]
fn gpt_gradients_match_the_f64_reference() {
    let model = Gpt::init(1);
    let ids = tokens(2 * 9);
    let x: Vec<i64> = ids.chunks(9).flat_map(|c| c[..8].to_vec()).collect();
    let y: Vec<i64> = ids.chunks(9).flat_map(|c| c[1..].to_vec()).collect();
    let (x, y) = (
        Tensor::from_i64(x, &[2, 8]).unwrap(),
        Tensor::from_i64(y, &[2, 8]).unwrap(),
    );

    let (loss, grads) = model.loss_and_grads(&mut Ctx::eval(), &x, &y).unwrap();

    let ir = Gpt::graph().unwrap();
    let f = ir.function("loss").unwrap();
    let params: HashMap<String, _> = model
        .named_params()
        .into_iter()
        .map(|(n, t)| (n, to_array(&t)))
        .collect();
    let env = HashMap::new();
    let ctx = RefCtx {
        env: &env,
        train: false,
        autocast: rtx_core::ir::AutocastMode::OFF,
        seed: 0,
    };
    let values = reference::run(
        &f.graph,
        &[to_array(&x), to_array(&y)],
        &|n| params.get(n).cloned(),
        &ctx,
    )
    .unwrap();
    let want = values[f.output].data[0];
    assert!(
        (f64::from(loss.item().unwrap()) - want).abs() < 1e-5 * want.abs(),
        "loss {loss:?} vs {want}"
    );
    for g in &f.grads {
        let rtx_core::ir::Op::Param { name, .. } = &f.graph.node(g.leaf).op else {
            continue;
        };
        let want = &values[g.grad.expect("every parameter reaches the loss")].data;
        let got = grads.get(name).unwrap().to_vec_f32().unwrap();
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-3);
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(*a) - b).abs() <= 1e-3 * scale,
                "{name}[{i}]: {a} vs {b} (scale {scale})"
            );
        }
    }
}

#[test]
fn a_sequence_longer_than_the_context_is_an_error() {
    let model = Gpt::init(0);
    let x = Tensor::from_i64(vec![1; 65], &[1, 65]).unwrap();

    let err = model.forward(&x).unwrap_err();

    assert!(err.to_string().contains("64"), "{err}");
}

#[test]
fn training_lowers_the_loss_and_repeats_bit_for_bit() {
    let stream = tokens(4096);
    let cfg = GptConfig {
        steps: 12,
        batch: 4,
        lr: 3e-3,
        warmup: 2,
        eval_every: 6,
        eval_batches: Some(2),
        ..GptConfig::default()
    };

    let (_, first) = train_gpt_on(&cfg, &stream[..3500], &stream[3500..]).unwrap();
    let (_, again) = train_gpt_on(&cfg, &stream[..3500], &stream[3500..]).unwrap();

    let losses = |r: &models::train_gpt::GptReport| -> Vec<u32> {
        r.curve
            .iter()
            .flat_map(|p| [p.train_loss.to_bits(), p.val_loss.unwrap().to_bits()])
            .collect()
    };
    assert_eq!(losses(&first), losses(&again));
    let (start, end) = (first.curve[0].val_loss.unwrap(), first.val_loss);
    assert!(end < start && end < 3.5, "validation loss {start} -> {end}");
}

#[test]
fn generation_with_a_seed_repeats_and_streams_what_it_returns() {
    use models::generate::{Sampling, generate};
    let model = Gpt::init(2);
    let vocab = Vocab::of(
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:.,;!?'\n-0123456789()[]{}&*/@_\"",
    );
    assert_eq!(vocab.len(), 84);
    let s = Sampling {
        temperature: 1.0,
        top_k: Some(20),
        top_p: Some(0.95),
        seed: 7,
    };
    let mut streamed = String::new();

    let first = generate(&model, &vocab, "ROMEO:", 70, &s, |c| streamed.push(c)).unwrap();
    let again = generate(&model, &vocab, "ROMEO:", 70, &s, |_| {}).unwrap();

    assert_eq!(
        first.chars().count(),
        70,
        "past the 64-position context too"
    );
    assert_eq!(first, again);
    assert_eq!(first, streamed);
}

#[test]
fn a_resumed_run_takes_the_steps_of_the_uninterrupted_one_bit_for_bit() {
    // 3500 training tokens hold 54 windows: 14 batches of 4 per epoch, so the resumed part
    // crosses into the second epoch's shuffled order.
    let stream = tokens(4096);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpt-resume");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let checkpoint = dir.join("train.safetensors");
    let cfg = GptConfig {
        steps: 18,
        batch: 4,
        lr: 3e-3,
        warmup: 2,
        eval_every: 6,
        eval_batches: Some(1),
        ..GptConfig::default()
    };
    let (train, validation) = (&stream[..3500], &stream[3500..]);
    let (whole_model, whole) = train_gpt_on(&cfg, train, validation).unwrap();

    let stopped = GptConfig {
        checkpoint: Some(checkpoint.clone()),
        stop_after: Some(7),
        ..cfg.clone()
    };
    let (_, first) = train_gpt_on(&stopped, train, validation).unwrap();
    let resumed = GptConfig {
        resume: Some(checkpoint.clone()),
        ..cfg.clone()
    };
    let (resumed_model, rest) = train_gpt_on(&resumed, train, validation).unwrap();

    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(first.losses.len(), 7);
    let joined: Vec<f32> = first.losses.iter().chain(&rest.losses).copied().collect();
    assert_eq!(
        bits(&joined),
        bits(&whole.losses),
        "per-step training losses"
    );
    assert_eq!(rest.val_loss.to_bits(), whole.val_loss.to_bits());
    for ((name, a), (_, b)) in whole_model
        .named_params()
        .iter()
        .zip(resumed_model.named_params().iter())
    {
        assert_eq!(
            bits(&a.to_vec_f32().unwrap()),
            bits(&b.to_vec_f32().unwrap()),
            "parameter {name}"
        );
    }
}

#[test]
fn resuming_with_other_settings_is_refused_naming_the_setting() {
    let stream = tokens(4096);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpt-resume-settings");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let checkpoint = dir.join("train.safetensors");
    let cfg = GptConfig {
        steps: 4,
        batch: 4,
        warmup: 1,
        eval_batches: Some(1),
        checkpoint: Some(checkpoint.clone()),
        stop_after: Some(1),
        ..GptConfig::default()
    };
    train_gpt_on(&cfg, &stream[..3500], &stream[3500..]).unwrap();

    let other = GptConfig {
        batch: 8,
        resume: Some(checkpoint),
        checkpoint: None,
        stop_after: None,
        ..cfg
    };
    let Err(err) = train_gpt_on(&other, &stream[..3500], &stream[3500..]) else {
        panic!("resuming with another batch size was accepted");
    };
    let err = err.to_string();

    assert!(err.contains("--batch 4") && err.contains("8"), "{err}");
}

/// Largest difference between two logit tensors, relative to the largest logit.
fn relative_difference(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let scale = a
        .to_vec_f32()
        .unwrap()
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    a.max_abs_diff(b).unwrap() / scale
}

#[test]
fn decoding_with_the_cache_gives_the_logits_of_recomputing_the_sequence() {
    let model = Gpt::init(4);
    // Two sequences of 40 characters: a 9-character prompt, then 31 positions one at a time.
    let ids: Vec<i64> = tokens(97)[17..].iter().take(80).copied().collect();
    let whole = model
        .forward(&Tensor::from_i64(ids.clone(), &[2, 40]).unwrap())
        .unwrap();
    let column = |from: usize, to: usize| -> Tensor {
        let rows: Vec<i64> = (0..2)
            .flat_map(|b| ids[b * 40 + from..b * 40 + to].to_vec())
            .collect();
        Tensor::from_i64(rows, &[2, to - from]).unwrap()
    };

    let mut cache = models::gpt::KvCache::new();
    let mut parts = vec![model.decode(&mut cache, &column(0, 9)).unwrap()];
    for j in 9..40 {
        parts.push(model.decode(&mut cache, &column(j, j + 1)).unwrap());
    }
    let cached = Tensor::concat(&parts.iter().collect::<Vec<_>>(), 1).unwrap();

    assert_eq!(cache.len(), 40);
    let err = relative_difference(&whole, &cached);
    assert!(
        err < 1e-5,
        "cached logits differ from recomputed ones by {err:e}"
    );
}

#[test]
fn decoding_from_an_empty_cache_one_position_at_a_time_matches_too() {
    let model = Gpt::init(5);
    let ids: Vec<i64> = tokens(12);
    let whole = model
        .forward(&Tensor::from_i64(ids.clone(), &[1, 12]).unwrap())
        .unwrap();

    let mut cache = models::gpt::KvCache::new();
    let parts: Vec<Tensor> = ids
        .iter()
        .map(|&id| {
            model
                .decode(&mut cache, &Tensor::from_i64(vec![id], &[1, 1]).unwrap())
                .unwrap()
        })
        .collect();
    let cached = Tensor::concat(&parts.iter().collect::<Vec<_>>(), 1).unwrap();

    let err = relative_difference(&whole, &cached);
    assert!(
        err < 1e-5,
        "cached logits differ from recomputed ones by {err:e}"
    );
}

#[test]
fn decoding_past_the_context_is_an_error_naming_it() {
    let model = Gpt::init(6);
    let mut cache = models::gpt::KvCache::new();
    model
        .decode(&mut cache, &Tensor::from_i64(tokens(60), &[1, 60]).unwrap())
        .unwrap();

    let err = model
        .decode(&mut cache, &Tensor::from_i64(tokens(5), &[1, 5]).unwrap())
        .unwrap_err()
        .to_string();

    assert!(err.contains("60") && err.contains("64"), "{err}");
    assert_eq!(cache.len(), 60, "a refused call changes nothing");
}
