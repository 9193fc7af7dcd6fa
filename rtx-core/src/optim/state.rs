//! The optimizers' per-parameter state: buffers and step counts in the model's parameter
//! order, their named tensors for checkpoints (PyTorch's names), and the alignment of a
//! loaded state to the model's parameters.

use super::Spare;
use crate::error::{Result, RtxError};
use crate::tensor::{Tensor, fmt_dims};

/// One parameter's optimizer state: up to two buffers of its size and a step count.
#[derive(Clone, Debug)]
pub(super) struct ParamState {
    pub(super) name: String,
    pub(super) shape: Vec<usize>,
    pub(super) first: Vec<f32>,
    pub(super) second: Vec<f32>,
    pub(super) steps: i32,
    /// The two buffers on the parameter's GPU once it has stepped there (then the host
    /// buffers above are stale; `host_state` reads them back).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub(super) device: Option<[Tensor; 2]>,
}

/// The state of every parameter, in the order the model visits them, and the step's
/// recycled lists.
#[derive(Clone, Debug, Default)]
pub(super) struct States(pub(super) Vec<ParamState>, pub(super) Spare);

impl States {
    /// Every parameter's buffers (`buffer_names`, for the buffers the optimizer keeps) and
    /// step count as named tensors.
    pub(super) fn to_tensors(&self, buffer_names: [&str; 2]) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for s in &self.0 {
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            let host = super::device::host_state(s)?;
            #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
            let host = [s.first.clone(), s.second.clone()];
            for (buffer, values) in buffer_names.iter().zip(&host) {
                if !values.is_empty() {
                    out.push((
                        format!("{}.{buffer}", s.name),
                        Tensor::from_vec(values.clone(), &s.shape)?,
                    ));
                }
            }
            out.push((
                format!("{}.step", s.name),
                Tensor::from_i64(vec![i64::from(s.steps)], &[])?,
            ));
        }
        Ok(out)
    }

    /// The state `to_tensors` wrote: one parameter per `{param}.step` tensor, with
    /// `buffers` of `buffer_names` each.
    pub(super) fn from_tensors(
        tensors: &[(String, Tensor)],
        buffer_names: [&str; 2],
        buffers: usize,
    ) -> Result<States> {
        let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        let bad = |message: String| RtxError::Invalid(format!("optimizer state: {message}"));
        let mut states = Vec::new();
        for (name, t) in tensors {
            let Some(param) = name.strip_suffix(".step") else {
                continue;
            };
            let steps = match t.to_vec_i64().ok().as_deref() {
                Some([s]) => i32::try_from(*s)
                    .ok()
                    .filter(|s| *s >= 0)
                    .ok_or_else(|| bad(format!("`{name}` is {s}, not a step count")))?,
                _ => {
                    return Err(bad(format!(
                        "`{name}` should be one i64 step count, found {:?} {:?}",
                        t.dtype(),
                        t.shape()
                    )));
                }
            };
            let mut bufs = [Vec::new(), Vec::new()];
            let mut shape = Vec::new();
            for (slot, buffer) in bufs.iter_mut().zip(buffer_names).take(buffers) {
                let key = format!("{param}.{buffer}");
                let b = find(&key).ok_or_else(|| bad(format!("missing `{key}`")))?;
                if !shape.is_empty() && b.shape() != shape.as_slice() {
                    return Err(bad(format!(
                        "`{key}` has shape {}, its other buffer {}",
                        fmt_dims(b.shape()),
                        fmt_dims(&shape)
                    )));
                }
                shape = b.shape().to_vec();
                *slot = b.to_vec_f32()?;
            }
            let [first, second] = bufs;
            states.push(ParamState {
                name: param.to_string(),
                shape,
                first,
                second,
                steps,
                #[cfg(any(feature = "wgpu", feature = "cuda"))]
                device: None,
            });
        }
        Ok(States(states, Spare::default()))
    }
}

/// Makes entry `index` the state of `name` (`buffers` of zeros in `shape` for a new
/// one). A state loaded from a checkpoint that does not fit the parameter is an error.
pub(super) fn align(
    list: &mut Vec<ParamState>,
    index: usize,
    name: &str,
    shape: &[usize],
    buffers: usize,
) -> Result<()> {
    let len = shape.iter().product();
    let fits = |s: &ParamState| {
        s.first.len() == if buffers >= 1 { len } else { 0 }
            && s.second.len() == if buffers >= 2 { len } else { 0 }
            && (buffers == 0 || s.shape == shape)
    };
    let misfit = |s: &ParamState| RtxError::ShapeMismatch {
        context: format!("optimizer state of `{name}`"),
        expected: format!("{buffers} buffer(s) of shape {}", fmt_dims(shape)),
        found: format!(
            "buffers of {} and {} values, shape {}",
            s.first.len(),
            s.second.len(),
            fmt_dims(&s.shape)
        ),
    };
    if let Some(s) = list.get(index).filter(|s| s.name == name) {
        return if fits(s) { Ok(()) } else { Err(misfit(s)) };
    }
    match list.iter().position(|s| s.name == name) {
        Some(at) => {
            if !fits(&list[at]) {
                return Err(misfit(&list[at]));
            }
            let last = list.len() - 1;
            list.swap(index.min(last), at);
        }
        None => {
            let fresh = ParamState {
                name: name.to_string(),
                shape: shape.to_vec(),
                first: if buffers >= 1 {
                    vec![0.0; len]
                } else {
                    Vec::new()
                },
                second: if buffers >= 2 {
                    vec![0.0; len]
                } else {
                    Vec::new()
                },
                steps: 0,
                #[cfg(any(feature = "wgpu", feature = "cuda"))]
                device: None,
            };
            let at = index.min(list.len());
            list.insert(at, fresh);
        }
    }
    Ok(())
}
