//! Save and load parameters as safetensors files (the `safetensors` crate), under the
//! model's dotted parameter names, so weights move to and from PyTorch unchanged.
//!
//! Loading is all-or-nothing: every tensor is read and checked (present, known dtype, right
//! shape, no extras) before the first parameter is replaced, so a bad file leaves the model as
//! it was. Saving is atomic ([`write_atomically`]): a crash or a kill during a save leaves the
//! previous file whole. Training checkpoints (`resume.rs`) add the optimizer's state under
//! [`OPTIMIZER_PREFIX`] in the same file; loading weights alone skips those tensors.

use crate::error::{Result, RtxError};
use crate::module::Module;
use crate::tensor::{Tensor, fmt_dims};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

/// Tensors whose names start with this hold optimizer state, not parameters.
pub const OPTIMIZER_PREFIX: &str = "optimizer.";

pub trait Checkpoint: Module {
    fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let tensors = self.named_params();
        let bytes = serialize(path, &tensors, None)?;
        write_atomically(path, &bytes)
    }

    /// Replaces every parameter with the file's tensor of the same name. Tensors under
    /// [`OPTIMIZER_PREFIX`] (a training checkpoint's optimizer state) are ignored; any other
    /// tensor the model lacks is an error.
    fn load_safetensors(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = read_file(path)?;
        let loaded = deserialize(&bytes)
            .and_then(|st| read_params(self, &st))
            .map_err(|message| checkpoint_error(path, message))?;
        let loaded = on_params_devices(self, loaded)?;
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

/// `loaded` (in visit order) moved to the devices of `model`'s parameters, so a model on a
/// GPU stays there; all moved before any parameter is replaced.
pub(crate) fn on_params_devices<M: Module + ?Sized>(
    model: &M,
    loaded: Vec<Tensor>,
) -> Result<Vec<Tensor>> {
    let mut devices = Vec::new();
    model.visit_params("", &mut |_, t| devices.push(t.device()));
    loaded
        .into_iter()
        .zip(devices)
        .map(|(t, d)| t.to(&d))
        .collect()
}

/// Every parameter of `model` read from the parsed file `st`, in visit order, or why the file
/// is unusable.
pub(crate) fn read_params<M: Module + ?Sized>(
    model: &M,
    st: &SafeTensors<'_>,
) -> std::result::Result<Vec<Tensor>, String> {
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
        if view.dtype() == Dtype::I64 {
            return Err(format!(
                "tensor `{name}` holds integers (I64); a parameter needs F32, F16 or BF16"
            ));
        }
        out.push(read_tensor(name, &view)?);
    }
    let known: HashSet<&str> = wanted.iter().map(|(n, _)| n.as_str()).collect();
    let mut extra: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| !known.contains(n.as_str()) && !n.starts_with(OPTIMIZER_PREFIX))
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

pub(crate) fn checkpoint_error(path: &Path, message: String) -> RtxError {
    RtxError::Checkpoint {
        path: path.display().to_string(),
        message,
    }
}

pub(crate) fn io_error(path: &Path, source: std::io::Error) -> RtxError {
    RtxError::Io {
        path: path.display().to_string(),
        source,
    }
}

pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| io_error(path, source))
}

pub(crate) fn deserialize(bytes: &[u8]) -> std::result::Result<SafeTensors<'_>, String> {
    SafeTensors::deserialize(bytes).map_err(|e| format!("not a valid safetensors file ({e})"))
}

/// The bytes of a safetensors file holding `tensors` (f32 as F32, i64 as I64; half tensors
/// are widened to F32) and `metadata`; `path` only names the file in errors.
pub(crate) fn serialize(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let mut buffers = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let (dtype, bytes): (Dtype, Vec<u8>) = match t.dtype() {
            crate::DType::I64 => (
                Dtype::I64,
                t.to_vec_i64()?
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            _ => (
                Dtype::F32,
                t.to_vec_f32()?
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        };
        buffers.push((name.as_str(), dtype, t.shape().to_vec(), bytes));
    }
    let mut views = Vec::with_capacity(buffers.len());
    for (name, dtype, shape, bytes) in &buffers {
        let view = TensorView::new(*dtype, shape.clone(), bytes)
            .map_err(|e| checkpoint_error(path, format!("tensor `{name}`: {e}")))?;
        views.push((*name, view));
    }
    safetensors::serialize(views, &metadata).map_err(|e| checkpoint_error(path, e.to_string()))
}

/// One tensor of a file as a `Tensor` (F32, F16 and BF16 become f32; I64 stays i64).
pub(crate) fn read_tensor(
    name: &str,
    view: &TensorView<'_>,
) -> std::result::Result<Tensor, String> {
    let data = view.data();
    let shape = view.shape();
    let floats: Vec<f32> = match view.dtype() {
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
        Dtype::I64 => {
            let ints = data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect();
            return Tensor::from_i64(ints, shape).map_err(|e| format!("tensor `{name}`: {e}"));
        }
        other => {
            return Err(format!(
                "tensor `{name}` has dtype {other:?}; expected F32, F16, BF16 or I64"
            ));
        }
    };
    Tensor::from_vec(floats, shape).map_err(|e| format!("tensor `{name}`: {e}"))
}

/// Replaces `path` with `bytes` so that a crash, a kill or a full disk at any moment leaves
/// either the old file or the new one, whole: the bytes go to a temporary file in the same
/// directory (a rename across file systems is not atomic), which is flushed to disk before it
/// is renamed over `path`; the directory is flushed after, so the rename itself survives a
/// power loss. A failed save removes its temporary file and leaves `path` untouched.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let Some(file_name) = path.file_name() else {
        return Err(checkpoint_error(
            path,
            "expected a file path, found a directory or an empty path".into(),
        ));
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(".{}.tmp", file_name.to_string_lossy()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    written.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        io_error(path, source)
    })
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Other systems have no portable way to flush a directory entry.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}
