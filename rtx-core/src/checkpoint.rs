//! Save and load parameters as safetensors files (the `safetensors` crate), under the
//! model's dotted parameter names, so weights move to and from PyTorch unchanged.
//!
//! Loading is all-or-nothing: every tensor is read and checked (present, known dtype, right
//! shape, no extras) before the first parameter is replaced, so a bad file leaves the model as
//! it was. Saving writes a temporary file and renames it, so a crash never leaves a
//! half-written checkpoint where a good one was.

use crate::error::{Result, RtxError};
use crate::module::Module;
use crate::tensor::{Tensor, fmt_dims};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashSet;
use std::path::Path;

pub trait Checkpoint: Module {
    fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let err = |message: String| RtxError::Checkpoint {
            path: path.display().to_string(),
            message,
        };
        let params = self.named_params();
        let mut buffers = Vec::with_capacity(params.len());
        for (name, t) in &params {
            let data = t.to_vec_f32()?;
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            buffers.push((name.clone(), t.shape().to_vec(), bytes));
        }
        let mut views = Vec::with_capacity(buffers.len());
        for (name, shape, bytes) in &buffers {
            let view = TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map_err(|e| err(format!("tensor `{name}`: {e}")))?;
            views.push((name.clone(), view));
        }
        let tmp = path.with_extension("safetensors.tmp");
        // A failed write or rename must not leave the temporary file behind.
        let written = safetensors::serialize_to_file(views, &None, &tmp)
            .map_err(|e| err(e.to_string()))
            .and_then(|()| {
                std::fs::rename(&tmp, path).map_err(|source| RtxError::Io {
                    path: path.display().to_string(),
                    source,
                })
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    fn load_safetensors(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| RtxError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let loaded = read_params(self, &bytes).map_err(|message| RtxError::Checkpoint {
            path: path.display().to_string(),
            message,
        })?;
        let mut it = loaded.into_iter();
        self.visit_params_mut("", &mut |_, t| {
            if let Some(new) = it.next() {
                *t = new;
            }
        });
        Ok(())
    }
}

impl<M: Module> Checkpoint for M {}

/// Every parameter of `model` read from `bytes`, in visit order, or why the file is unusable.
fn read_params<M: Module + ?Sized>(
    model: &M,
    bytes: &[u8],
) -> std::result::Result<Vec<Tensor>, String> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file ({e})"))?;
    let wanted = model_params(model);
    let mut out = Vec::with_capacity(wanted.len());
    for (name, shape) in &wanted {
        let view = st.tensor(name).map_err(|_| {
            format!(
                "missing tensor `{name}` (expected shape {})",
                fmt_dims(shape)
            )
        })?;
        if view.shape() != shape.as_slice() {
            return Err(format!(
                "tensor `{name}` has shape {}, the model expects {}",
                fmt_dims(view.shape()),
                fmt_dims(shape)
            ));
        }
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(format!(
                    "tensor `{name}` has dtype {other:?}; expected F32, F16 or BF16"
                ));
            }
        };
        out.push(Tensor::from_vec(values, shape).map_err(|e| format!("tensor `{name}`: {e}"))?);
    }
    let known: HashSet<&str> = wanted.iter().map(|(n, _)| n.as_str()).collect();
    let mut extra: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| !known.contains(n.as_str()))
        .cloned()
        .collect();
    if !extra.is_empty() {
        extra.sort();
        return Err(format!(
            "unexpected tensor(s) {} that the model does not have",
            extra.join(", ")
        ));
    }
    Ok(out)
}

fn model_params<M: Module + ?Sized>(model: &M) -> Vec<(String, Vec<usize>)> {
    let mut v = Vec::new();
    model.visit_params("", &mut |n, t| v.push((n.to_string(), t.shape().to_vec())));
    v
}
