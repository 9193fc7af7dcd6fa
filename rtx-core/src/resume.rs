//! Training checkpoints: everything a run needs to continue bit-identically after a stop.
//!
//! One safetensors file, written atomically (`checkpoint::write_atomically`): the parameters
//! under their own names (so `load_safetensors` and `generate` read it as weights, and
//! PyTorch's `load_state_dict` does once the `optimizer.` keys are dropped), the optimizer's
//! state under [`OPTIMIZER_PREFIX`] (`optimizer.blocks.0.attn.q.weight.exp_avg`, `...step`),
//! and the training loop's own counters (step, RNG state, data position, running sums) as
//! the file's string metadata, which the loop reads back with [`TrainingMeta::get`].
//! Floats are written with Rust's shortest round-trip formatting, so they come back exact.

use crate::checkpoint::{
    OPTIMIZER_PREFIX, checkpoint_error, deserialize, read_file, read_params, read_tensor,
    serialize, write_atomically,
};
use crate::error::Result;
use crate::module::Module;
use crate::optim::Optimizer;
use crate::tensor::{Tensor, fmt_dims};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::path::Path;
use std::str::FromStr;

/// The metadata key that marks a training checkpoint, and its value.
const FORMAT_KEY: &str = "format";
const FORMAT: &str = "rtx-training-1";

/// A training loop's own state, as named values (`step`, `rng`, `epoch`, ...).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainingMeta(BTreeMap<String, String>);

impl TrainingMeta {
    pub fn new() -> TrainingMeta {
        TrainingMeta::default()
    }

    /// Records `value` under `key` (floats round-trip exactly).
    pub fn set(&mut self, key: &str, value: impl Display) -> &mut TrainingMeta {
        self.0.insert(key.to_string(), value.to_string());
        self
    }

    /// The value under `key`, parsed; a missing or malformed value is an error naming the
    /// key and what was found.
    pub fn get<T: FromStr>(&self, key: &str) -> Result<T> {
        let text = self.0.get(key).ok_or_else(|| {
            crate::RtxError::Invalid(format!(
                "the training checkpoint has no `{key}` (keys present: {})",
                self.0.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        text.parse().map_err(|_| {
            crate::RtxError::Invalid(format!(
                "the training checkpoint's `{key}` is `{text}`, expected a {}",
                std::any::type_name::<T>()
            ))
        })
    }

    pub fn raw(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// Writes `model`'s parameters, `optimizer`'s state and `meta` to `path` atomically: a crash
/// or kill at any moment leaves the previous file at `path` loadable.
pub fn save_training<M: Module + ?Sized, O: Optimizer>(
    path: impl AsRef<Path>,
    model: &M,
    optimizer: &O,
    meta: &TrainingMeta,
) -> Result<()> {
    let path = path.as_ref();
    let mut tensors = Vec::new();
    let mut clash = None;
    model.visit_params("", &mut |name, t| {
        if name.starts_with(OPTIMIZER_PREFIX) {
            clash.get_or_insert_with(|| name.to_string());
        }
        tensors.push((name.to_string(), t.clone()));
    });
    if let Some(name) = clash {
        return Err(checkpoint_error(
            path,
            format!(
                "parameter `{name}` starts with `{OPTIMIZER_PREFIX}`, which training checkpoints reserve for optimizer state; rename the field"
            ),
        ));
    }
    for (name, t) in optimizer.state_tensors()? {
        tensors.push((format!("{OPTIMIZER_PREFIX}{name}"), t));
    }
    let mut metadata: HashMap<String, String> = meta.0.clone().into_iter().collect();
    metadata.insert(FORMAT_KEY.into(), FORMAT.into());
    let bytes = serialize(path, &tensors, Some(metadata))?;
    write_atomically(path, &bytes)
}

/// Reads a file `save_training` wrote into `model` and `optimizer` (built with the same
/// hyperparameters) and returns the loop's metadata. All or nothing: every tensor is checked
/// against the model first, so a bad file changes neither.
pub fn load_training<M: Module, O: Optimizer>(
    path: impl AsRef<Path>,
    model: &mut M,
    optimizer: &mut O,
) -> Result<TrainingMeta> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let bad = |message: String| checkpoint_error(path, message);
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| bad(format!("not a valid safetensors file ({e})")))?;
    let mut meta: BTreeMap<String, String> = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    if meta.remove(FORMAT_KEY).as_deref() != Some(FORMAT) {
        return Err(bad(format!(
            "expected a training checkpoint (metadata `{FORMAT_KEY}: {FORMAT}`), found a file without one: weights alone cannot resume a run (load them with `load_safetensors`)"
        )));
    }
    let st = deserialize(&bytes).map_err(bad)?;
    let params = read_params(model, &st).map_err(bad)?;
    let params = crate::checkpoint::on_params_devices(&*model, params)?;
    let mut shapes = HashMap::new();
    model.visit_params("", &mut |name, t| {
        shapes.insert(name.to_string(), t.shape().to_vec());
    });
    let mut state = Vec::new();
    let mut names: Vec<&String> = st.names();
    names.sort();
    for full in names {
        let Some(name) = full.strip_prefix(OPTIMIZER_PREFIX) else {
            continue;
        };
        let view = st
            .tensor(full)
            .map_err(|e| bad(format!("tensor `{full}`: {e}")))?;
        let t: Tensor = read_tensor(full, &view).map_err(bad)?;
        let Some((param, buffer)) = name.rsplit_once('.') else {
            return Err(bad(format!("optimizer tensor `{full}` names no parameter")));
        };
        match shapes.get(param) {
            None => {
                return Err(bad(format!(
                    "optimizer state `{full}` is for `{param}`, which the model does not have"
                )));
            }
            Some(shape) if buffer != "step" && t.shape() != shape.as_slice() => {
                return Err(bad(format!(
                    "optimizer state `{full}` has shape {}, the parameter {}",
                    fmt_dims(t.shape()),
                    fmt_dims(shape)
                )));
            }
            Some(_) => state.push((name.to_string(), t)),
        }
    }
    optimizer
        .load_state_tensors(&state)
        .map_err(|e| bad(e.to_string()))?;
    let mut it = params.into_iter();
    model.visit_params_mut("", &mut |_, t| {
        if let Some(new) = it.next() {
            *t = new;
        }
    });
    Ok(TrainingMeta(meta))
}
