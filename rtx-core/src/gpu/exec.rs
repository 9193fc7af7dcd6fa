//! One graph function's plan on a device: the steps of `rtx_ir::emit::passes` (the plan the
//! CPU code was generated from), their emitted kernels made once per function and pass, and
//! each value dropped after its last reader.

use super::ops::{self, pointwise};
use crate::ctx::Ctx;
use crate::device::Device;
use crate::error::{Result, RtxError};
use crate::module::{Grads, Module};
use crate::tensor::Tensor;
use rtx_ir::emit::{KernelSource, Target, kernel, passes};
use rtx_ir::fusion::Step;
use rtx_ir::{Atom, Dim, GraphFn, NodeId, Op};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A pass of a function ready to run: its steps, each step's kernel (for fused and row
/// groups), and after which step each value is last read.
struct Plan {
    steps: Vec<Step>,
    kernels: Vec<Option<KernelSource>>,
    /// Per step, the values to drop after it.
    frees: Vec<Vec<NodeId>>,
}

/// A function, whether the pass has its backward, and whether its kernels are CUDA C.
type PlanKey = (usize, bool, bool);

static PLANS: Mutex<Vec<(PlanKey, Arc<Plan>)>> = Mutex::new(Vec::new());

/// The plan of `f` (forward alone, or with `backward`) with kernels for `target`, made once
/// per process.
fn plan_of(f: &'static GraphFn, backward: bool, target: Target) -> Result<Arc<Plan>> {
    let key = (
        f as *const GraphFn as usize,
        backward,
        target == Target::Cuda,
    );
    if let Ok(plans) = PLANS.lock()
        && let Some((_, p)) = plans.iter().find(|(k, _)| *k == key)
    {
        return Ok(Arc::clone(p));
    }
    let pass = if backward { "all" } else { "forward" };
    let steps = passes(f)
        .into_iter()
        .find(|(name, _)| *name == pass)
        .map(|(_, s)| s)
        .ok_or_else(|| {
            RtxError::Invalid(format!("graph function `{}` has no {pass} pass", f.name))
        })?;
    let kernels = steps
        .iter()
        .enumerate()
        .map(|(i, s)| kernel(&f.graph, s, &format!("{}_{pass}_{i}", f.name), target))
        .collect();
    let mut roots = vec![f.output];
    if backward {
        roots.extend(f.grads.iter().filter_map(|g| g.grad));
        roots.extend(f.grads.iter().map(|g| g.leaf));
    }
    let mut last = vec![None; f.graph.len()];
    for (i, s) in steps.iter().enumerate() {
        for r in reads(f, s) {
            last[r] = Some(i);
        }
    }
    let mut frees = vec![Vec::new(); steps.len()];
    for (node, at) in last.iter().enumerate() {
        if let Some(at) = at
            && !roots.contains(&node)
        {
            frees[*at].push(node);
        }
    }
    let plan = Arc::new(Plan {
        steps,
        kernels,
        frees,
    });
    if let Ok(mut plans) = PLANS.lock() {
        plans.push((key, Arc::clone(&plan)));
    }
    Ok(plan)
}

/// The values step `s` reads.
fn reads(f: &GraphFn, s: &Step) -> Vec<NodeId> {
    match s {
        Step::Kernel(n) => f.graph.node(*n).args.clone(),
        Step::Fused { inputs, .. } | Step::Rows { inputs, .. } => inputs.clone(),
        Step::MatMulEpilogue { matmul, inputs, .. } => {
            let mut r = f.graph.node(*matmul).args.clone();
            r.extend(inputs.iter().filter(|&&i| i != *matmul));
            r
        }
        Step::MatMulRowSums { matmul, sums } => {
            let mut r = f.graph.node(*matmul).args.clone();
            r.extend(f.graph.node(*sums).args.iter());
            r
        }
    }
}

/// A call's values by node id, with leaves (inputs, parameters, constants) made on demand.
struct Values {
    f: &'static GraphFn,
    device: Device,
    params: HashMap<String, Tensor>,
    env: HashMap<String, i64>,
    slots: Vec<Option<Tensor>>,
}

impl Values {
    fn shape(&self, id: NodeId) -> Result<Vec<usize>> {
        self.f
            .graph
            .node(id)
            .shape
            .iter()
            .map(|d| eval(d, &self.env))
            .collect()
    }

    fn get(&mut self, id: NodeId) -> Result<Tensor> {
        if let Some(Some(t)) = self.slots.get(id) {
            return Ok(t.clone());
        }
        let node = self.f.graph.node(id);
        let t = match &node.op {
            Op::Const { value } => Tensor::scalar(*value as f32).to(&self.device)?,
            Op::Input { name, .. } => {
                return Err(RtxError::Invalid(format!(
                    "graph input `{name}` is missing"
                )));
            }
            Op::Param { name, .. } => {
                let t = self
                    .params
                    .get(name)
                    .cloned()
                    .ok_or_else(|| RtxError::Invalid(format!("no parameter `{name}`")))?;
                if t.device() != self.device {
                    return Err(RtxError::DeviceMismatch {
                        context: format!("parameter `{name}` of `{}`", self.f.name),
                        expected: format!("the inputs' device, {}", self.device),
                        found: format!("{}; move the model with `model.to(&device)`", t.device()),
                    });
                }
                t
            }
            _ => {
                return Err(RtxError::Invalid(format!(
                    "node {id} of `{}` was read before it was computed",
                    self.f.name
                )));
            }
        };
        self.slots[id] = Some(t.clone());
        Ok(t)
    }

    fn set(&mut self, id: NodeId, t: Tensor) {
        self.slots[id] = Some(t);
    }
}

fn eval(d: &Dim, env: &HashMap<String, i64>) -> Result<usize> {
    d.eval(env)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| {
            RtxError::Gpu(format!(
                "dimension `{d}` cannot be evaluated on the device: graph functions of models with const generic parameters do not run on GPUs yet"
            ))
        })
}

/// Binds each input's symbolic dimensions (the generated code already checked them).
fn bind(f: &GraphFn, inputs: &[&Tensor]) -> HashMap<String, i64> {
    let mut env = HashMap::new();
    for node in &f.graph.nodes {
        if let Op::Input { index, shape, .. } = &node.op
            && let Some(t) = inputs.get(*index)
        {
            for (d, &n) in shape.iter().zip(t.shape()) {
                if let Some(Atom::Sym(s)) = d.as_single_atom() {
                    env.entry(s.clone()).or_insert(n as i64);
                }
            }
        }
    }
    env
}

fn run(
    device: &Device,
    module: &impl Module,
    f: &'static GraphFn,
    ctx: &mut Ctx,
    inputs: &[&Tensor],
    backward: bool,
) -> Result<Values> {
    let gpu = device
        .gpu()
        .ok_or_else(|| RtxError::Gpu("a device plan for tensors on the cpu".into()))?;
    let plan = plan_of(f, backward, ops::target(gpu))?;
    let mut params = HashMap::new();
    module.visit_params("", &mut |name, t| {
        params.insert(name.to_string(), t.clone());
    });
    let mut v = Values {
        f,
        device: device.clone(),
        params,
        env: bind(f, inputs),
        slots: vec![None; f.graph.len()],
    };
    for (id, node) in f.graph.nodes.iter().enumerate() {
        if let Op::Input { index, .. } = &node.op
            && let Some(t) = inputs.get(*index)
        {
            v.slots[id] = Some((*t).clone());
        }
    }
    let profiling = crate::profile::enabled();
    let call = if backward { "and_grads" } else { "forward" };
    for (i, step) in plan.steps.iter().enumerate() {
        if profiling {
            // Each step waits for the device before and after, so its time is its kernels'.
            sync(device)?;
            let start = std::time::Instant::now();
            run_step(&mut v, step, plan.kernels[i].as_ref(), ctx)?;
            sync(device)?;
            let (kind, node) = step_kind(step);
            let flops = step_flops(&v, step);
            crate::profile::record_step(Some((f, call)), kind, node, start.elapsed(), flops);
        } else {
            run_step(&mut v, step, plan.kernels[i].as_ref(), ctx)?;
        }
        for &id in &plan.frees[i] {
            v.slots[id] = None;
        }
    }
    Ok(v)
}

/// Waits for everything queued on `device` (for `RTX_PROFILE`'s per-step times).
fn sync(device: &Device) -> Result<()> {
    match device {
        Device::Gpu(d) => Ok(d.finish()?),
        Device::Cpu => Ok(()),
    }
}

/// The profile's name for a step and the node it is filed under (the CPU's names, so the
/// two tables read alike).
fn step_kind(step: &Step) -> (&'static str, NodeId) {
    match step {
        Step::Kernel(n) => ("kernel", *n),
        Step::Fused { outputs, .. } => ("fused", outputs.first().copied().unwrap_or(0)),
        Step::Rows { outputs, .. } => ("rows", outputs.first().copied().unwrap_or(0)),
        Step::MatMulEpilogue { matmul, .. } => ("matmul_fused", *matmul),
        Step::MatMulRowSums { matmul, .. } => ("matmul_row_sums", *matmul),
    }
}

/// `2 m n k` for a step that multiplies matrices (its product's numel times the left
/// operand's last axis), else 0.
fn step_flops(v: &Values, step: &Step) -> u64 {
    let matmul = match step {
        Step::MatMulEpilogue { matmul, .. } | Step::MatMulRowSums { matmul, .. } => *matmul,
        Step::Kernel(n) if matches!(v.f.graph.node(*n).op, Op::MatMul) => *n,
        _ => return 0,
    };
    let node = v.f.graph.node(matmul);
    let (Ok(out), Some(Ok(a))) = (v.shape(matmul), node.args.first().map(|&a| v.shape(a))) else {
        return 0;
    };
    let k = a.last().copied().unwrap_or(0);
    2 * (out.iter().product::<usize>() * k) as u64
}

fn run_step(
    v: &mut Values,
    step: &Step,
    kernel: Option<&KernelSource>,
    ctx: &mut Ctx,
) -> Result<()> {
    match step {
        Step::Kernel(n) => run_node(v, *n, ctx),
        Step::Fused {
            shape_of,
            inputs,
            body,
            outputs,
        } => {
            let shape = v.shape(*shape_of)?;
            let ins = inputs
                .iter()
                .map(|&i| v.get(i))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = ins.iter().collect();
            let outs = pointwise(body, &refs, outputs, &shape, kernel, ctx)?;
            for (&o, t) in outputs.iter().zip(outs) {
                v.set(o, t);
            }
            Ok(())
        }
        Step::MatMulEpilogue {
            matmul,
            shape_of,
            inputs,
            body,
            outputs,
        } => {
            // On wgpu one kernel (the GEMM runs the group on each value it finishes); on
            // CUDA cuBLAS, then the group over the product.
            let kernel =
                kernel.ok_or_else(|| RtxError::Gpu("a matmul epilogue has no kernel".into()))?;
            let product = v.f.graph.node(*matmul);
            let (a, b) = (v.get(product.args[0])?, v.get(product.args[1])?);
            let product_shape = v.shape(*matmul)?;
            let shape = v.shape(*shape_of)?;
            let others = inputs[1..]
                .iter()
                .map(|&i| v.get(i))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = others.iter().collect();
            let outs = super::gemm::gemm_epilogue(
                (&a, &b, &product_shape),
                &refs,
                super::gemm::Epilogue {
                    body,
                    outputs,
                    kernel,
                },
                &shape,
                ctx,
            )?;
            for (&o, t) in outputs.iter().zip(outs) {
                v.set(o, t);
            }
            Ok(())
        }
        Step::MatMulRowSums { matmul, sums } => {
            run_node(v, *matmul, ctx)?;
            run_node(v, *sums, ctx)
        }
        Step::Rows {
            shape_of,
            inputs,
            outputs,
            ..
        } => {
            let wide = v.shape(*shape_of)?;
            let ins = inputs
                .iter()
                .map(|&i| v.get(i))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = ins.iter().collect();
            let kernel = kernel.ok_or_else(|| RtxError::Gpu("a row group has no kernel".into()))?;
            let shapes = outputs
                .iter()
                .map(|&o| v.shape(o))
                .collect::<Result<Vec<_>>>()?;
            let outs = rows(&refs, &wide, &shapes, kernel, ctx)?;
            for (&o, t) in outputs.iter().zip(outs) {
                v.set(o, t);
            }
            Ok(())
        }
    }
}

/// A row group: one thread per row of `wide` (see `rtx_ir::emit::rows`).
fn rows(
    inputs: &[&Tensor],
    wide: &[usize],
    shapes: &[Vec<usize>],
    kernel: &KernelSource,
    ctx: &Ctx,
) -> Result<Vec<Tensor>> {
    let first = inputs
        .first()
        .ok_or_else(|| RtxError::Gpu("a row group without inputs".into()))?;
    let device = Arc::clone(&ops::gpu(first)?.device);
    let outs: Vec<Tensor> = shapes
        .iter()
        .map(|s| Ok(ops::wrap(&device, device.zeros(s.iter().product())?, s)))
        .collect::<Result<_>>()?;
    let ins: Vec<_> = inputs
        .iter()
        .map(|t| ops::gpu(t).map(|s| &s.buffer))
        .collect::<Result<_>>()?;
    let out_bufs: Vec<_> = outs
        .iter()
        .map(|t| ops::gpu(t).map(|s| &s.buffer))
        .collect::<Result<_>>()?;
    let cols = wide.last().copied().unwrap_or(1).max(1);
    let rows = wide.iter().product::<usize>() / cols;
    device.run_emitted(
        &ops::as_kernel(kernel),
        &ops::meta(inputs, wide, ctx)?,
        &ins,
        &out_bufs,
        rows,
        rtx_ir::emit::ROWS_GROUP,
    )?;
    Ok(outs)
}

fn run_node(v: &mut Values, id: NodeId, ctx: &mut Ctx) -> Result<()> {
    let node = v.f.graph.node(id);
    let shape = v.shape(id)?;
    let out = if node.args.is_empty() {
        // Constants, positions, iotas: made on the host (they are small) and uploaded.
        crate::ops::run_op(&node.op, &[], ctx)?.to(&v.device)?
    } else {
        let args = node
            .args
            .clone()
            .iter()
            .map(|&a| v.get(a))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = args.iter().collect();
        ops::run(&node.op, &refs, &shape, ctx)?
    };
    v.set(id, out);
    Ok(())
}

pub(crate) fn forward(
    device: &Device,
    module: &impl Module,
    f: &'static GraphFn,
    ctx: &mut Ctx,
    inputs: &[&Tensor],
) -> Result<Tensor> {
    let mut v = run(device, module, f, ctx, inputs, false)?;
    v.slots[f.output]
        .take()
        .ok_or_else(|| RtxError::Invalid(format!("`{}` computed no output", f.name)))
}

pub(crate) fn and_grads(
    device: &Device,
    module: &impl Module,
    f: &'static GraphFn,
    ctx: &mut Ctx,
    inputs: &[&Tensor],
) -> Result<(Tensor, Grads)> {
    let mut v = run(device, module, f, ctx, inputs, true)?;
    let mut grads = Grads::new();
    for g in &f.grads {
        let name = match &f.graph.node(g.leaf).op {
            Op::Param { name, .. } | Op::Input { name, .. } => name,
            _ => continue,
        };
        let shape = v.shape(g.leaf)?;
        let value = match g.grad {
            Some(id) => {
                let t = v.get(id)?;
                if t.shape() != shape.as_slice() {
                    return Err(RtxError::ShapeMismatch {
                        context: format!("gradient of `{name}`"),
                        expected: crate::tensor::fmt_dims(&shape),
                        found: crate::tensor::fmt_dims(t.shape()),
                    });
                }
                t.try_contiguous()?
            }
            None => Tensor::zeros(&shape).to(device)?,
        };
        grads.push(name.as_str(), value);
    }
    let loss = v.slots[f.output]
        .take()
        .ok_or_else(|| RtxError::Invalid(format!("`{}` computed no output", f.name)))?;
    Ok((loss, grads))
}
