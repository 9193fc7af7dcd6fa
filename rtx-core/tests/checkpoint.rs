//! Checkpoints: safetensors save and load of a model's parameters.
//!
//! A round trip is bit-identical; every unusable file (truncated, random bytes, a wrongly
//! shaped, missing or extra tensor, an unsupported dtype, no file at all) is an `Err` whose
//! message names the problem, and leaves the model exactly as it was; f16 and bf16 files (as
//! PyTorch writes them) load; saving replaces a file without leaving a temporary behind.

mod common;

use common::Rng;
use rtx_core::checkpoint::Checkpoint;
use rtx_core::{Linear, Module, RtxError, Tensor, join_name};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Two linear layers under dotted names: `fc1.weight [2, 3]`, `fc1.bias [2]`,
/// `fc2.weight [1, 2]`, `fc2.bias [1]`.
struct Net {
    fc1: Linear<3, 2>,
    fc2: Linear<2, 1>,
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

const SHAPES: [(&str, &[usize]); 4] = [
    ("fc1.weight", &[2, 3]),
    ("fc1.bias", &[2]),
    ("fc2.weight", &[1, 2]),
    ("fc2.bias", &[1]),
];

/// Every parameter's name, shape and bits, to compare models exactly.
fn snapshot(m: &Net) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    m.named_params()
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                t.shape().to_vec(),
                t.to_vec_f32()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            )
        })
        .collect()
}

/// A fresh empty directory for one test under cargo's per-target scratch space.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("checkpoint-tests")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes tensors given as `(name, dtype, shape, little-endian bytes)` with the safetensors
/// crate directly, as another program would.
fn write_raw(
    path: &Path,
    tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
    metadata: Option<HashMap<String, String>>,
) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, &metadata, path).unwrap();
}

/// Random f32 tensors for `shapes`, as `write_raw` entries.
fn f32_entries(
    rng: &mut Rng,
    shapes: &[(&str, &[usize])],
) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    shapes
        .iter()
        .map(|(n, s)| {
            let v = rng.vec(s.iter().product(), -1.0, 1.0);
            (
                n.to_string(),
                Dtype::F32,
                s.to_vec(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect()
}

/// Loads `path` into a fresh model, expects a checkpoint error, checks the model did not
/// change, and returns the message.
fn load_fails(path: &Path) -> String {
    let mut model = Net::init(7);
    let before = snapshot(&model);
    let err = model
        .load_safetensors(path)
        .expect_err("loading should fail");
    assert_eq!(snapshot(&model), before, "a failed load changed the model");
    err.to_string()
}

/// The names of the files in `dir`, sorted.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

#[test]
fn save_then_load_is_bit_identical() {
    let dir = scratch("round_trip");
    let path = dir.join("net.safetensors");
    let saved = Net::init(1);
    saved.save_safetensors(&path).unwrap();
    let mut loaded = Net::init(2);
    assert_ne!(
        snapshot(&loaded),
        snapshot(&saved),
        "test setup: the two seeds should differ"
    );
    loaded.load_safetensors(&path).unwrap();
    assert_eq!(snapshot(&loaded), snapshot(&saved));
}

#[test]
fn saved_file_holds_f32_tensors_under_dotted_names() {
    let dir = scratch("names");
    let path = dir.join("net.safetensors");
    Net::init(3).save_safetensors(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, shape) in SHAPES {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::F32, "{name}");
        assert_eq!(t.shape(), shape, "{name}");
    }
    assert_eq!(st.names().len(), SHAPES.len());
}

#[test]
fn truncated_file_is_an_error_and_leaves_the_model_unchanged() {
    let dir = scratch("truncated");
    let good = dir.join("good.safetensors");
    Net::init(4).save_safetensors(&good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    for keep in [0, 4, 8, 20, bytes.len() / 2, bytes.len() - 1] {
        let path = dir.join(format!("cut{keep}.safetensors"));
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let msg = load_fails(&path);
        assert_mentions(
            &msg,
            &["not a valid safetensors file", &path.display().to_string()],
        );
    }
}

#[test]
fn random_bytes_are_an_error_and_leave_the_model_unchanged() {
    let dir = scratch("random_bytes");
    let mut rng = Rng::new(5);
    for (i, len) in [1usize, 7, 8, 9, 64, 1000].into_iter().enumerate() {
        let path = dir.join(format!("noise{i}.safetensors"));
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        assert_mentions(&load_fails(&path), &["not a valid safetensors file"]);
    }
}

#[test]
fn a_plausible_header_length_over_garbage_is_an_error() {
    let dir = scratch("garbage_header");
    let path = dir.join("garbage.safetensors");
    let mut rng = Rng::new(6);
    let mut bytes = 40u64.to_le_bytes().to_vec();
    bytes.extend((0..60).map(|_| rng.next_u64() as u8));
    std::fs::write(&path, bytes).unwrap();
    assert_mentions(&load_fails(&path), &["not a valid safetensors file"]);
}

#[test]
fn wrongly_shaped_tensor_is_an_error_naming_both_shapes() {
    let dir = scratch("wrong_shape");
    let path = dir.join("net.safetensors");
    let shapes: Vec<(&str, &[usize])> = SHAPES
        .iter()
        .map(|&(n, s)| {
            if n == "fc1.weight" {
                (n, &[3usize, 2][..])
            } else {
                (n, s)
            }
        })
        .collect();
    write_raw(&path, &f32_entries(&mut Rng::new(7), &shapes), None);
    assert_mentions(&load_fails(&path), &["`fc1.weight`", "[3, 2]", "[2, 3]"]);
}

#[test]
fn missing_tensor_is_an_error_naming_it() {
    let dir = scratch("missing");
    let path = dir.join("net.safetensors");
    write_raw(&path, &f32_entries(&mut Rng::new(8), &SHAPES[..3]), None);
    assert_mentions(&load_fails(&path), &["missing tensor `fc2.bias`", "[1]"]);
}

#[test]
fn extra_tensor_is_an_error_naming_it() {
    let dir = scratch("extra");
    let path = dir.join("net.safetensors");
    let mut shapes = SHAPES.to_vec();
    shapes.push(("fc3.weight", &[4]));
    write_raw(&path, &f32_entries(&mut Rng::new(9), &shapes), None);
    assert_mentions(&load_fails(&path), &["unexpected tensor", "fc3.weight"]);
}

#[test]
fn unsupported_dtype_is_an_error_naming_it() {
    let dir = scratch("dtype");
    let path = dir.join("net.safetensors");
    let mut entries = f32_entries(&mut Rng::new(10), &SHAPES);
    let (_, dtype, _, bytes) = &mut entries[1];
    *dtype = Dtype::I32;
    assert_eq!(bytes.len(), 2 * 4);
    write_raw(&path, &entries, None);
    assert_mentions(&load_fails(&path), &["`fc1.bias`", "I32"]);
}

#[test]
fn nonexistent_path_is_an_io_error_naming_it() {
    let dir = scratch("nonexistent");
    let path = dir.join("no-such-file.safetensors");
    let mut model = Net::init(11);
    let before = snapshot(&model);
    let err = model.load_safetensors(&path).unwrap_err();
    assert!(matches!(err, RtxError::Io { .. }), "{err:?}");
    assert_mentions(&err.to_string(), &["no-such-file.safetensors"]);
    assert_eq!(snapshot(&model), before);
}

/// Writes every parameter of `SHAPES` in a half-precision dtype and returns the values the
/// file holds, widened to f32.
fn write_half(path: &Path, dtype: Dtype, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let mut entries = Vec::new();
    let mut values = Vec::new();
    for (name, shape) in SHAPES {
        let v = rng.vec(shape.iter().product(), -1.0, 1.0);
        let (bytes, widened): (Vec<u8>, Vec<f32>) = match dtype {
            Dtype::F16 => {
                let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                (
                    h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    h.iter().map(|x| x.to_f32()).collect(),
                )
            }
            Dtype::BF16 => {
                let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
                (
                    h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    h.iter().map(|x| x.to_f32()).collect(),
                )
            }
            _ => unreachable!(),
        };
        entries.push((name.to_string(), dtype, shape.to_vec(), bytes));
        values.push(widened);
    }
    write_raw(path, &entries, None);
    values
}

#[test]
fn f16_file_loads_exactly() {
    let dir = scratch("f16");
    let path = dir.join("net.safetensors");
    let want = write_half(&path, Dtype::F16, 12);
    let mut model = Net::init(13);
    model.load_safetensors(&path).unwrap();
    let got: Vec<Vec<f32>> = model
        .named_params()
        .iter()
        .map(|(_, t)| t.to_vec_f32().unwrap())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn bf16_file_loads_exactly() {
    let dir = scratch("bf16");
    let path = dir.join("net.safetensors");
    let want = write_half(&path, Dtype::BF16, 14);
    let mut model = Net::init(15);
    model.load_safetensors(&path).unwrap();
    let got: Vec<Vec<f32>> = model
        .named_params()
        .iter()
        .map(|(_, t)| t.to_vec_f32().unwrap())
        .collect();
    assert_eq!(got, want);
}

#[test]
fn file_with_pytorch_metadata_loads() {
    let dir = scratch("metadata");
    let path = dir.join("net.safetensors");
    let entries = f32_entries(&mut Rng::new(16), &SHAPES);
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_raw(&path, &entries, Some(metadata));
    let mut model = Net::init(17);
    model.load_safetensors(&path).unwrap();
    let want: Vec<Vec<u8>> = entries.iter().map(|e| e.3.clone()).collect();
    let got: Vec<Vec<u8>> = model
        .named_params()
        .iter()
        .map(|(_, t)| {
            t.to_vec_f32()
                .unwrap()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn saving_over_an_existing_checkpoint_replaces_it_and_leaves_no_temporary_file() {
    let dir = scratch("overwrite");
    let path = dir.join("net.safetensors");
    Net::init(18).save_safetensors(&path).unwrap();
    let newer = Net::init(19);
    newer.save_safetensors(&path).unwrap();
    let names = file_names(&dir);
    assert_eq!(
        names,
        vec!["net.safetensors".to_string()],
        "files left in the directory"
    );
    let mut loaded = Net::init(20);
    loaded.load_safetensors(&path).unwrap();
    assert_eq!(snapshot(&loaded), snapshot(&newer));
}

#[test]
fn saving_into_a_missing_directory_is_an_error_naming_the_path() {
    let dir = scratch("missing_dir");
    let path = dir.join("no-such-dir").join("net.safetensors");
    let err = Net::init(21).save_safetensors(&path).unwrap_err();
    assert_mentions(&err.to_string(), &["no-such-dir"]);
}

#[test]
fn failed_save_leaves_no_temporary_file() {
    let dir = scratch("failed_save");
    // The target is a directory, so the final rename must fail.
    let path = dir.join("net.safetensors");
    std::fs::create_dir(&path).unwrap();
    let err = Net::init(22).save_safetensors(&path).unwrap_err();
    assert_mentions(&err.to_string(), &["net.safetensors"]);
    let names = file_names(&dir);
    assert_eq!(
        names,
        vec!["net.safetensors".to_string()],
        "files left in the directory"
    );
}
