//! The optimizer step of a model whose parameters live on a GPU: one update kernel per
//! parameter (`Gpu::optimizer_step`, the same formulas as the CPU loop), in place,
//! with the state buffers kept on the device next to the parameter.

use super::{ParamState, States, align};
use crate::error::{Result, RtxError};
use crate::gpu::storage as gpu_storage;
use crate::module::{Grads, Module};
use crate::tensor::{Tensor, fmt_dims};
use rtx_backends::kernel_meta::UpdateRule;

/// Whether `model`'s parameters are on a device (then all of them must be on the same one).
pub(super) fn on_device<M: Module>(model: &M) -> bool {
    let mut any = false;
    model.visit_params("", &mut |_, t| any |= !t.device().is_cpu());
    any
}

/// One step over every parameter with a gradient; `rule(state)` gives its update after its
/// step count was incremented.
pub(super) fn step<M: Module>(
    model: &mut M,
    grads: &Grads,
    states: &mut States,
    buffers: usize,
    rule: impl Fn(&ParamState) -> UpdateRule,
) -> Result<()> {
    let States(list, _) = states;
    let mut index = 0;
    let mut first_err = None;
    model.visit_params_mut("", &mut |name, t| {
        if first_err.is_some() {
            return;
        }
        let Some(g) = grads.get(name) else { return };
        let result = (|| {
            if g.shape() != t.shape() {
                return Err(RtxError::ShapeMismatch {
                    context: format!("gradient of `{name}`"),
                    expected: fmt_dims(t.shape()),
                    found: fmt_dims(g.shape()),
                });
            }
            let device = t.device();
            if g.device() != device {
                return Err(RtxError::DeviceMismatch {
                    context: format!("gradient of `{name}`"),
                    expected: format!("the parameter's device, {device}"),
                    found: g.device().to_string(),
                });
            }
            align(list, index, name, t.shape(), buffers)?;
            let state = &mut list[index];
            index += 1;
            state.steps += 1;
            update(t, &g.try_contiguous()?, state, buffers, rule(state))
        })();
        if let Err(e) = result {
            first_err = Some(e);
        }
    });
    first_err.map_or(Ok(()), Err)
}

fn update(
    param: &mut Tensor,
    grad: &Tensor,
    state: &mut ParamState,
    buffers: usize,
    rule: UpdateRule,
) -> Result<()> {
    let device = param.device();
    // The kernel writes in place: a parameter or state buffer another tensor also reads
    // (a clone the caller kept) is copied first, as the CPU step does.
    if !param.owns_contiguous_buffer() {
        *param = crate::gpu::copy(param)?;
    }
    let on_device = match &mut state.device {
        Some(bufs) => bufs,
        slot => {
            let upload = |values: &[f32]| -> Result<Tensor> {
                let len = values.len().max(1);
                let mut v = values.to_vec();
                v.resize(len, 0.0);
                Tensor::from_vec(v, &[len])?.to(&device)
            };
            slot.insert([upload(&state.first)?, upload(&state.second)?])
        }
    };
    for b in on_device.iter_mut().take(buffers) {
        if !b.owns_contiguous_buffer() {
            *b = crate::gpu::copy(b)?;
        }
    }
    let (p, g) = (gpu_storage(param)?, gpu_storage(grad)?);
    let (s1, s2) = (gpu_storage(&on_device[0])?, gpu_storage(&on_device[1])?);
    p.device.optimizer_step(
        (rule, param.numel()),
        &p.buffer,
        &g.buffer,
        [&s1.buffer, &s2.buffer],
    )?;
    Ok(())
}

/// The device state of `s` read back into its host buffers (for `state_tensors`).
pub(super) fn host_state(s: &ParamState) -> Result<[Vec<f32>; 2]> {
    match &s.device {
        Some([a, b]) => {
            let read = |t: &Tensor, host: &Vec<f32>| -> Result<Vec<f32>> {
                if host.is_empty() {
                    return Ok(Vec::new());
                }
                let mut v = t.to_vec_f32()?;
                v.truncate(host.len());
                Ok(v)
            };
            Ok([read(a, &s.first)?, read(b, &s.second)?])
        }
        None => Ok([s.first.clone(), s.second.clone()]),
    }
}
