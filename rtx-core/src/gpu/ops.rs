//! The core ops on a GPU: views share the buffer, pointwise work runs as kernels
//! emitted by `rtx_ir::emit` (also for copies and broadcasts: an identity group over a
//! strided input), the rest as the backend's GEMM, reduction and gather kernels. An op with
//! no device kernel yet runs on the CPU with its operands copied over and back, counted in
//! [`fallbacks`], so a model runs everywhere while its missing kernels are visible.

use crate::ctx::Ctx;
use crate::device::GpuStorage;
use crate::error::{Result, RtxError};
use crate::tensor::{DType, Storage, Tensor};
use rtx_backends::Layout;
use rtx_backends::gpu::{DeviceBuffer, DeviceView, Gpu, Kernel, KernelLanguage};
use rtx_backends::kernel_meta::Reduce;
use rtx_ir::emit::{KernelSource, Meta, POINTWISE_GROUP, Target, fused_kernel};
use rtx_ir::fusion::{Instr, Operand, Pointwise, Step};
use rtx_ir::{NodeId, Op};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

static FALLBACKS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

pub(crate) fn fallbacks() -> Vec<(String, usize)> {
    FALLBACKS
        .lock()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
        .unwrap_or_default()
}

/// The device storage of `t`, or an error naming where it is instead.
pub(crate) fn gpu(t: &Tensor) -> Result<&GpuStorage> {
    match t.storage() {
        Storage::Gpu(s) => Ok(s),
        _ => Err(RtxError::DeviceMismatch {
            context: "a kernel on a GPU".into(),
            expected: "operands on that device".into(),
            found: "one on the cpu; move it with `.to(&device)`".into(),
        }),
    }
}

/// A tensor over a fresh device buffer of `buffer`'s values, contiguous in `shape`.
pub(crate) fn wrap(device: &Arc<Gpu>, buffer: DeviceBuffer, shape: &[usize]) -> Tensor {
    Tensor::from_parts(
        Storage::Gpu(GpuStorage {
            device: Arc::clone(device),
            buffer,
            dtype: DType::F32,
            host_i64: None,
        }),
        Layout::contiguous(shape),
    )
}

pub(crate) fn fresh(device: &Arc<Gpu>, shape: &[usize]) -> Result<Tensor> {
    let n = shape.iter().product();
    Ok(wrap(device, device.zeros(n)?, shape))
}

/// A device tensor's values on the CPU, contiguous.
pub(crate) fn download(t: &Tensor) -> Result<Tensor> {
    let s = gpu(t)?;
    if s.dtype == DType::I64 {
        let all: Vec<i64> = match &s.host_i64 {
            Some(v) => v.clone(),
            None => s
                .device
                .read_f32(&s.buffer)?
                .iter()
                .map(|v| v.to_bits() as i64)
                .collect(),
        };
        let host = Tensor::from_parts(Storage::I64(all), t.layout().clone());
        return host.try_contiguous();
    }
    let all = s.device.read_f32(&s.buffer)?;
    Tensor::from_parts(Storage::F32(all), t.layout().clone()).try_contiguous()
}

/// `t` in a contiguous buffer of its own shape on its device (`t` itself when it is one).
pub(crate) fn contiguous(t: &Tensor) -> Result<Tensor> {
    if t.layout().is_contiguous() && t.layout().offset == 0 {
        return Ok(t.clone());
    }
    if gpu(t)?.dtype == DType::I64 {
        let host = download(t)?;
        return host.to(&t.device());
    }
    copy_to(t, t.shape())
}

/// `t` broadcast to `shape`, written contiguously (an identity group over its strides).
pub(crate) fn copy_to(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let body = [Instr {
        node: 1,
        op: Pointwise::Identity,
        args: vec![Operand::Input(0)],
    }];
    let mut out = pointwise(&body, &[t], &[1], shape, None, &Ctx::eval())?;
    out.pop()
        .ok_or_else(|| RtxError::Gpu("a copy kernel wrote no output".into()))
}

/// The meta strides of `t` read at every element of `shape` (right-aligned broadcasting:
/// stride 0 along axes `t` lacks or has as 1).
pub(crate) fn broadcast_strides(t: &Tensor, shape: &[usize]) -> Result<Vec<u32>> {
    let l = t.layout();
    let lead = shape.len().checked_sub(l.rank()).ok_or_else(|| {
        RtxError::Gpu(format!(
            "an operand of rank {} read at shape {shape:?}",
            l.rank()
        ))
    })?;
    (0..shape.len())
        .map(|d| {
            if d < lead {
                return Ok(0);
            }
            let (size, stride) = (l.shape[d - lead], l.strides[d - lead]);
            let s = if size == 1 && shape[d] != 1 {
                0
            } else {
                stride
            };
            u32::try_from(s).map_err(|_| RtxError::Gpu(format!("stride {s} exceeds 2^32")))
        })
        .collect()
}

pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| RtxError::Gpu(format!("{what} {v} exceeds 2^32")))
}

/// The meta words of a group of `shape` reading `inputs`.
pub(crate) fn meta(inputs: &[&Tensor], shape: &[usize], ctx: &Ctx) -> Result<Vec<u32>> {
    let dims: Vec<u32> = shape
        .iter()
        .map(|&d| u32_of(d, "dimension"))
        .collect::<Result<_>>()?;
    let per_input: Vec<(u32, Vec<u32>)> = inputs
        .iter()
        .map(|t| {
            Ok((
                u32_of(t.layout().offset, "offset")?,
                broadcast_strides(t, shape)?,
            ))
        })
        .collect::<Result<_>>()?;
    Ok(Meta::words(&dims, &per_input, ctx.rounding().words()))
}

/// Runs a pointwise body over `shape` (the kernel given, or one emitted for it), returning
/// one contiguous tensor per output.
pub(crate) fn pointwise(
    body: &[Instr],
    inputs: &[&Tensor],
    outputs: &[NodeId],
    shape: &[usize],
    kernel: Option<&KernelSource>,
    ctx: &Ctx,
) -> Result<Vec<Tensor>> {
    let first = inputs
        .first()
        .ok_or_else(|| RtxError::Gpu("a device group without inputs".into()))?;
    let device = Arc::clone(&gpu(first)?.device);
    let emitted;
    let kernel = match kernel {
        Some(k) => k,
        None => {
            emitted = group_kernel(body, inputs.len(), outputs, target(&device))?;
            &*emitted
        }
    };
    let outs: Vec<Tensor> = outputs
        .iter()
        .map(|_| fresh(&device, shape))
        .collect::<Result<_>>()?;
    let ins: Vec<&DeviceBuffer> = inputs
        .iter()
        .map(|t| gpu(t).map(|s| &s.buffer))
        .collect::<Result<_>>()?;
    let out_bufs: Vec<&DeviceBuffer> = outs
        .iter()
        .map(|t| gpu(t).map(|s| &s.buffer))
        .collect::<Result<_>>()?;
    let n: usize = shape.iter().product();
    device.run_emitted(
        &as_kernel(kernel),
        &meta(inputs, shape, ctx)?,
        &ins,
        &out_bufs,
        n,
        POINTWISE_GROUP,
    )?;
    Ok(outs)
}

/// The emitted kernel of a group made here rather than by a plan (copies, broadcasts, eager
/// pointwise ops), emitted once per distinct body: copies run on every non-contiguous read.
fn group_kernel(
    body: &[Instr],
    inputs: usize,
    outputs: &[NodeId],
    target: Target,
) -> Result<Arc<KernelSource>> {
    type Key = (String, usize, Vec<NodeId>, bool);
    type Emitted = Mutex<HashMap<Key, Arc<KernelSource>>>;
    static EMITTED: std::sync::LazyLock<Emitted> = std::sync::LazyLock::new(Default::default);
    let key = (
        format!("{body:?}"),
        inputs,
        outputs.to_vec(),
        target == Target::Cuda,
    );
    if let Some(k) = EMITTED.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(k);
    }
    let step = Step::Fused {
        shape_of: 0,
        inputs: (0..inputs).collect(),
        body: body.to_vec(),
        outputs: outputs.to_vec(),
    };
    let k = Arc::new(
        fused_kernel(&step, "rtx_group", target)
            .ok_or_else(|| RtxError::Gpu("no kernel for a pointwise group".into()))?,
    );
    if let Ok(mut m) = EMITTED.lock() {
        m.insert(key, Arc::clone(&k));
    }
    Ok(k)
}

/// The target `rtx_ir::emit` writes kernels in for `device`.
pub(crate) fn target(device: &Gpu) -> Target {
    match device.language() {
        KernelLanguage::Wgsl => Target::Wgsl,
        KernelLanguage::Cuda => Target::Cuda,
    }
}

pub(crate) fn as_kernel(k: &KernelSource) -> Kernel<'_> {
    Kernel {
        name: &k.name,
        source: &k.source,
        entry: &k.entry,
    }
}

pub(crate) fn view<'a>(t: &'a Tensor) -> Result<DeviceView<'a>> {
    let l = t.layout();
    Ok(DeviceView {
        buffer: &gpu(t)?.buffer,
        offset: l.offset,
        shape: l.shape.to_vec(),
        strides: l.strides.to_vec(),
    })
}

fn reduce(x: &Tensor, reduced: &[bool], mode: Reduce, out_shape: &[usize]) -> Result<Tensor> {
    let device = Arc::clone(&gpu(x)?.device);
    let out = fresh(&device, out_shape)?;
    device.reduce(&view(x)?, reduced, mode, &gpu(&out)?.buffer)?;
    Ok(out)
}

/// The i64 values of an index operand on the device (kept on the host at upload).
fn host_indices(t: &Tensor) -> Result<Vec<i64>> {
    download(t)?.to_vec_i64()
}

/// The CPU kernels' index check: every index in `0..limit`, or the error naming `context`
/// (the same words `RtxError::from(KernelError::Index)` uses).
fn check_range(ids: &[i64], limit: usize, context: &str) -> Result<()> {
    match ids.iter().position(|&v| v < 0 || v as usize >= limit) {
        Some(i) => Err(RtxError::IndexOutOfRange {
            context: context.into(),
            index: i,
            value: ids[i],
            limit,
        }),
        None => Ok(()),
    }
}

const PICK_INDICES: &str = "class labels (cross_entropy) / pick indices";
const EMBEDDING_IDS: &str = "embedding ids";

/// `t`'s buffer under another layout (a region of it).
fn layout_view<'a>(t: &'a Tensor, l: &Layout) -> Result<DeviceView<'a>> {
    Ok(DeviceView {
        buffer: &gpu(t)?.buffer,
        offset: l.offset,
        shape: l.shape.to_vec(),
        strides: l.strides.to_vec(),
    })
}

/// The value of node op `op` over `args` (`out_shape` evaluated from the IR).
pub(crate) fn run(op: &Op, args: &[&Tensor], out_shape: &[usize], ctx: &mut Ctx) -> Result<Tensor> {
    let a = |i: usize| -> Result<&Tensor> {
        args.get(i)
            .copied()
            .ok_or_else(|| RtxError::Gpu(format!("`{op:?}` is missing operand {i}")))
    };
    if let Some(p) = Pointwise::of(op) {
        let body = [Instr {
            node: args.len(),
            op: p,
            args: (0..args.len()).map(Operand::Input).collect(),
        }];
        let mut out = pointwise(&body, args, &[args.len()], out_shape, None, ctx)?;
        return out.pop().ok_or_else(|| RtxError::Gpu("no output".into()));
    }
    if let Some(t) = super::nn::run(op, args, out_shape)? {
        return Ok(t);
    }
    Ok(match op {
        Op::Reshape { .. } => a(0)?.reshape(out_shape)?,
        Op::Permute { perm } => a(0)?.with_layout(a(0)?.layout().permute(perm)),
        Op::Narrow { axis, start, len } => {
            a(0)?.with_layout(a(0)?.layout().narrow(*axis, *start, *len))
        }
        Op::BroadcastTo => a(0)?.with_layout(a(0)?.layout().broadcast_to(out_shape)),
        Op::MatMul => super::gemm::matmul(a(0)?, a(1)?, out_shape)?,
        Op::Sum { axes, .. } | Op::Mean { axes, .. } | Op::Max { axes, .. } => {
            let x = a(0)?;
            let mut reduced = vec![false; x.rank()];
            for &ax in axes {
                if let Some(r) = reduced.get_mut(ax) {
                    *r = true;
                }
            }
            let mode = match op {
                Op::Sum { .. } => Reduce::Sum,
                Op::Mean { .. } => Reduce::Mean,
                _ => Reduce::Max,
            };
            reduce(x, &reduced, mode, out_shape)?
        }
        Op::SumTo => {
            let x = a(0)?;
            let lead = x.rank().saturating_sub(out_shape.len());
            let reduced: Vec<bool> = (0..x.rank())
                .map(|d| d < lead || (out_shape[d - lead] == 1 && x.shape()[d] != 1))
                .collect();
            reduce(x, &reduced, Reduce::Sum, out_shape)?
        }
        Op::MeanGrad { axes, keepdim } => {
            // g / count, broadcast back over the reduced axes.
            let (x, g) = (a(0)?, a(1)?);
            let count: usize = axes.iter().filter_map(|&ax| x.shape().get(ax)).product();
            let g = if *keepdim {
                g.clone()
            } else {
                let mut shape = g.shape().to_vec();
                let mut strides = g.layout().strides.to_vec();
                let mut sorted = axes.clone();
                sorted.sort_unstable();
                for ax in sorted {
                    let at = ax.min(shape.len());
                    shape.insert(at, 1);
                    strides.insert(at, 0);
                }
                let mut l = g.layout().clone();
                l.shape = shape.as_slice().into();
                l.strides = strides.as_slice().into();
                g.with_layout(l)
            };
            let body = [Instr {
                node: 1,
                op: Pointwise::Div,
                args: vec![Operand::Input(0), Operand::Const(count.max(1) as f64)],
            }];
            let mut out = pointwise(&body, &[&g], &[1], out_shape, None, ctx)?;
            out.pop().ok_or_else(|| RtxError::Gpu("no output".into()))?
        }
        Op::Pick | Op::PickGrad => {
            // Pick reads x [rows, cols] and writes [rows]; its gradient reads g [rows] and
            // writes [rows, cols].
            let (values, idx) = (contiguous(a(0)?)?, a(1)?);
            let grad = matches!(op, Op::PickGrad);
            let wide = if grad { out_shape } else { values.shape() };
            let cols = wide.last().copied().unwrap_or(1);
            let rows = wide.iter().product::<usize>() / cols.max(1);
            check_range(&host_indices(idx)?, cols, PICK_INDICES)?;
            let idx = contiguous(idx)?;
            let device = Arc::clone(&gpu(&values)?.device);
            let out = fresh(&device, out_shape)?;
            let (v, i, o) = (
                &gpu(&values)?.buffer,
                &gpu(&idx)?.buffer,
                &gpu(&out)?.buffer,
            );
            if grad {
                device.pick_grad(v, i, (rows, cols), o)?;
            } else {
                device.pick(v, i, (rows, cols), o)?;
            }
            out
        }
        Op::MaxGrad { axes, .. } => {
            let (x, g) = (a(0)?, contiguous(a(1)?)?);
            let mut reduced = vec![false; x.rank()];
            for &ax in axes {
                if let Some(r) = reduced.get_mut(ax) {
                    *r = true;
                }
            }
            let device = Arc::clone(&gpu(x)?.device);
            let firsts = device.zeros(g.numel())?;
            device.reduce(&view(x)?, &reduced, Reduce::ArgMax, &firsts)?;
            let out = fresh(&device, out_shape)?;
            device.scatter_first(
                (out_shape, &reduced),
                &gpu(&g)?.buffer,
                &firsts,
                &gpu(&out)?.buffer,
            )?;
            out
        }
        Op::ArgMax { axis } => {
            let x = a(0)?;
            let mut reduced = vec![false; x.rank()];
            if let Some(r) = reduced.get_mut(*axis) {
                *r = true;
            }
            let device = Arc::clone(&gpu(x)?.device);
            let words = device.zeros(out_shape.iter().product())?;
            device.reduce(&view(x)?, &reduced, Reduce::ArgMax, &words)?;
            super::nn::indices(device, words, out_shape)
        }
        Op::Embedding => {
            let (w, ids) = (a(0)?, a(1)?);
            let vocab = w.shape().first().copied().unwrap_or(0);
            let host = host_indices(ids)?;
            check_range(&host, vocab, EMBEDDING_IDS)?;
            let ids = contiguous(ids)?;
            let device = Arc::clone(&gpu(w)?.device);
            let out = fresh(&device, out_shape)?;
            device.gather_rows(
                &view(w)?,
                &gpu(&ids)?.buffer,
                host.len(),
                &gpu(&out)?.buffer,
            )?;
            out
        }
        Op::EmbeddingGrad => {
            // The rows of each id, grouped on the host (the ids are there): one thread per
            // output value sums its rows in order, without atomics.
            let (g, ids) = (contiguous(a(0)?)?, a(1)?);
            let (vocab, cols) = (out_shape[0], out_shape.get(1).copied().unwrap_or(1));
            let host = host_indices(ids)?;
            check_range(&host, vocab, EMBEDDING_IDS)?;
            let mut starts = vec![0u32; vocab + 1];
            for &id in &host {
                starts[id as usize + 1] += 1;
            }
            for v in 0..vocab {
                starts[v + 1] += starts[v];
            }
            let mut next = starts.clone();
            let mut rows = vec![0u32; host.len()];
            for (k, &id) in host.iter().enumerate() {
                rows[next[id as usize] as usize] = u32_of(k, "embedding row")?;
                next[id as usize] += 1;
            }
            let device = Arc::clone(&gpu(&g)?.device);
            let (starts, rows) = (device.upload_u32(&starts)?, device.upload_u32(&rows)?);
            let out = fresh(&device, out_shape)?;
            device.scatter_rows(
                &gpu(&g)?.buffer,
                (&starts, &rows),
                (vocab, cols),
                &gpu(&out)?.buffer,
            )?;
            out
        }
        Op::Concat { axis } => {
            let device = Arc::clone(&gpu(a(0)?)?.device);
            let out = fresh(&device, out_shape)?;
            let mut start = 0;
            for part in args {
                let len = part.shape()[*axis];
                let place = out.layout().narrow(*axis, start, len);
                device.copy_into(&view(part)?, &layout_view(&out, &place)?)?;
                start += len;
            }
            out
        }
        Op::ConcatGrad { axis, index } => {
            let start: usize = args[1..1 + index].iter().map(|t| t.shape()[*axis]).sum();
            let len = a(1 + index)?.shape()[*axis];
            a(0)?.with_layout(a(0)?.layout().narrow(*axis, start, len))
        }
        Op::PadNarrow { axis, start } => {
            let g = a(0)?;
            let device = Arc::clone(&gpu(g)?.device);
            let out = fresh(&device, out_shape)?;
            let place = out.layout().narrow(*axis, *start, g.shape()[*axis]);
            device.copy_into(&view(g)?, &layout_view(&out, &place)?)?;
            out
        }
        Op::Iota { .. } | Op::Positions { .. } => {
            // Values from the output shape alone: made on the host, uploaded.
            let host_arg = Tensor::zeros(a(0)?.shape());
            let device = a(0)?.device();
            crate::ops::run_op(op, &[&host_arg], ctx)?.to(&device)?
        }
        Op::DropoutMask { p } => {
            // Drawn on the host from the call's seed stream, as the CPU does, so a run on
            // the device drops the same units as one on the CPU; then uploaded.
            let n = a(0)?.numel();
            let device = crate::Device::Gpu(Arc::clone(&gpu(a(0)?)?.device));
            let mask = if ctx.train && *p > 0.0 {
                let seed = ctx.next_seed();
                Tensor::from_vec(
                    rtx_backends::cpu::dropout_mask(n, *p as f32, seed)?,
                    out_shape,
                )?
            } else {
                Tensor::full(out_shape, 1.0)
            };
            mask.to(&device)?
        }
        _ => return fallback(op, args, ctx),
    })
}

/// `op` on the CPU: operands copied to the host, the result copied back.
fn fallback(op: &Op, args: &[&Tensor], ctx: &mut Ctx) -> Result<Tensor> {
    let device = match args.first() {
        Some(t) => t.device(),
        None => {
            return Err(RtxError::Gpu(format!(
                "`{op:?}` has no operand on a device"
            )));
        }
    };
    let host: Vec<Tensor> = args
        .iter()
        .map(|t| t.to(&crate::Device::Cpu))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = host.iter().collect();
    let out = crate::ops::run_op(op, &refs, ctx)?;
    if let Ok(mut m) = FALLBACKS.lock() {
        let name = format!("{op:?}");
        let name = name.split([' ', '{', '(']).next().unwrap_or("").to_string();
        *m.entry(name).or_insert(0) += 1;
    }
    out.to(&device)
}
