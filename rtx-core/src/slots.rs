//! The values of one call of a compiled graph function, held by node id.
//!
//! The code `graph!` emits is a schedule: one statement per step, each a call of a method
//! here with the step's node ids as constants (`__s.fused([3, 7], [9], shape, kernel)?`).
//! Holding the values in one table instead of one local variable per node keeps every
//! statement a few instructions long: with locals, each `?` needed its own cleanup of every
//! tensor alive at that point, and rustc compiled a 1500-node GPT step into one function of
//! ~180k LLVM instructions (most of a 10-minute release build). A table also drops what is
//! left in one loop, whatever step failed.
//!
//! For the same reason a step returns nothing: the first error is kept, later steps do
//! nothing, and [`Slots::finish`] returns it once at the end (no `?` per step).
//!
//! The table is recycled between calls (a training step allocates nothing after the first).
//! Reading an empty slot is an internal error, never a panic: the schedule comes from the
//! compiler's liveness plan, which never reads a value after its last use.

use crate::ctx::Ctx;
use crate::error::{Result, RtxError};
use crate::fused::{self, FusedArg, Kernel, RowIn};
use crate::module::Grads;
use crate::planned::CallPlan;
use crate::tensor::Tensor;
use rtx_backends::arena::{Arena, Region};
use rtx_ir::fusion::Step;
use rtx_ir::{GraphFn, Node, Op};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The tables of finished calls, for the next ones (several threads may run graph functions
/// at once; each takes its own).
static SPARE: Mutex<Vec<Vec<Option<Tensor>>>> = Mutex::new(Vec::new());

/// Runs `$step` with `$body` bound to whichever version of a kernel the call chose
/// ([`Kernel`]): the two versions are different closure types, so the step is compiled once
/// for each.
macro_rules! with_body {
    ($kernel:expr, |$body:ident| $step:expr) => {
        match $kernel {
            Kernel::Plain($body) => $step,
            Kernel::Rounding($body) => $step,
        }
    };
}

/// One slot per node of the function's graph; see the module docs.
#[doc(hidden)]
pub struct Slots {
    values: Vec<Option<Tensor>>,
    /// The first step that failed, if one did.
    error: Option<RtxError>,
    /// Where the call's intermediates lie, and the arena they lie in (`planned.rs`).
    arena: Option<(Arc<CallPlan>, Arc<Arena>)>,
    /// Whether steps are timed (`profile.rs`), and the IR the step labels come from.
    profiling: bool,
    ir: Option<(&'static GraphFn, &'static str)>,
}

impl Drop for Slots {
    fn drop(&mut self) {
        let mut values = std::mem::take(&mut self.values);
        // Dropping the values gives their arena regions back before the arena is kept.
        values.clear();
        if let Ok(mut spare) = SPARE.lock() {
            spare.push(values);
        }
        if let Some((plan, arena)) = self.arena.take() {
            plan.give_back(arena);
        }
    }
}

impl Slots {
    /// An empty table of `len` slots.
    pub fn new(len: usize) -> Slots {
        let mut values = SPARE
            .lock()
            .ok()
            .and_then(|mut spare| spare.pop())
            .unwrap_or_default();
        values.resize_with(len, || None);
        Slots {
            values,
            error: None,
            arena: None,
            profiling: crate::profile::enabled(),
            ir: None,
        }
    }

    /// [`Slots::new`] for a call of nodes `0..upto` of `f` (results `roots`, symbols as in
    /// `dims`) whose kernels write their outputs at the offsets of the call's arena plan
    /// (`planned.rs`); with `fused` false (the unfused schedule) or arenas off, every buffer
    /// comes from the buffer cache.
    pub fn planned(
        len: usize,
        fused: bool,
        f: &GraphFn,
        upto: usize,
        roots: &[usize],
        dims: &[(&str, i64)],
    ) -> Slots {
        let mut slots = Slots::new(len);
        if fused && let Some(plan) = crate::planned::plan_for(f, upto, roots, dims) {
            let arena = plan.arena();
            slots.arena = Some((plan, arena));
        }
        slots
    }

    /// [`Slots::planned`] for a function whose shapes are all static: the arena plan is the
    /// one the macro fixed at compile time.
    pub fn planned_static(len: usize, fused: bool, plan: &crate::planned::StaticPlan) -> Slots {
        let mut slots = Slots::new(len);
        if fused && let Some(plan) = plan.call_plan() {
            let arena = plan.arena();
            slots.arena = Some((plan, arena));
        }
        slots
    }

    /// The arena region planned for node `id`'s value of `len` elements, when the call has
    /// an arena and the region is free (`Arena::claim`).
    fn region(&self, id: usize, len: usize) -> Option<Region> {
        let (plan, arena) = self.arena.as_ref()?;
        arena.claim(plan.buffer(id)?, len)
    }

    fn regions<const M: usize>(&self, ids: [usize; M], lens: [usize; M]) -> [Option<Region>; M] {
        let mut m = 0;
        ids.map(|id| {
            m += 1;
            self.region(id, lens[m - 1])
        })
    }

    /// Whether node `id`'s value is planned to go into the same buffer as `donor`'s.
    fn shares_buffer(&self, id: usize, donor: usize) -> bool {
        self.arena.as_ref().is_some_and(|(plan, _)| {
            plan.buffer(id).is_some() && plan.buffer(id) == plan.buffer(donor)
        })
    }

    /// The error of the first step that failed, if any: the schedule's one check.
    pub fn finish(&mut self) -> Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Names the function this call runs and which call it is (`forward`, `and_grads`), for
    /// the profiler's step labels.
    pub fn describe(&mut self, f: &'static GraphFn, call: &'static str) {
        self.ir = Some((f, call));
    }

    /// Runs a step unless an earlier one failed, keeping its error.
    fn step(&mut self, f: impl FnOnce(&mut Slots) -> Result<()>) {
        if self.error.is_none()
            && let Err(e) = f(self)
        {
            self.error = Some(e);
        }
    }

    /// [`Slots::step`] for the step of kind `kind` at `node`, timed when profiling;
    /// `flops` counts its arithmetic (called only when profiling).
    fn timed(
        &mut self,
        kind: &'static str,
        node: usize,
        flops: impl FnOnce(&Slots) -> u64,
        f: impl FnOnce(&mut Slots) -> Result<()>,
    ) {
        if !self.profiling {
            return self.step(f);
        }
        let flops = flops(self);
        let start = std::time::Instant::now();
        self.step(f);
        crate::profile::record_step(self.ir, kind, node, start.elapsed(), flops);
    }

    /// `2 m n k` for a product of shape `out` whose left operand is node `a`.
    fn product_flops(&self, a: usize, out: &[usize]) -> u64 {
        let k = self
            .values
            .get(a)
            .and_then(|v| v.as_ref())
            .and_then(|t| t.shape().last().copied());
        2 * out.iter().product::<usize>() as u64 * k.unwrap_or(0) as u64
    }

    fn slot(&mut self, id: usize) -> Result<&mut Option<Tensor>> {
        let len = self.values.len();
        self.values
            .get_mut(id)
            .ok_or_else(|| internal(format!("node {id} is outside the schedule's {len} slots")))
    }

    /// Stores the value of node `id`, replacing any earlier one.
    pub fn set(&mut self, id: usize, value: Tensor) -> Result<()> {
        *self.slot(id)? = Some(value);
        Ok(())
    }

    /// Stores a copy of a borrowed input or parameter (a handle: the data is shared).
    pub fn leaf(&mut self, id: usize, value: &Tensor) {
        self.step(|s| s.set(id, value.clone()))
    }

    /// Stores a scalar constant.
    pub fn constant(&mut self, id: usize, value: f32) {
        self.step(|s| s.set(id, Tensor::scalar(value)))
    }

    /// The gradients a `*_and_grads` function returns: `(name, gradient node, leaf node)`
    /// each, a leaf no path reached (no gradient node) getting zeros of its shape. Call after
    /// [`Slots::finish`].
    pub fn grads(&self, table: &[(&'static str, Option<usize>, usize)]) -> Result<Grads> {
        let mut grads = Grads::new();
        for &(name, grad, leaf) in table {
            let shape = self.get(leaf)?.shape();
            grads.push(
                name,
                match grad {
                    Some(g) => crate::ops::materialize(self.get(g)?, shape)?,
                    None => Tensor::zeros(shape),
                },
            );
        }
        Ok(grads)
    }

    /// The value of node `id`.
    pub fn get(&self, id: usize) -> Result<&Tensor> {
        self.values
            .get(id)
            .and_then(Option::as_ref)
            .ok_or_else(|| internal(format!("node {id} was read before it was computed")))
    }

    /// Takes the value of node `id` out of its slot.
    pub fn take(&mut self, id: usize) -> Result<Tensor> {
        self.slot(id)?
            .take()
            .ok_or_else(|| internal(format!("node {id} was taken before it was computed")))
    }

    /// Drops the values of `ids` (each after its last reader), so their buffers go back to
    /// the cache for the next kernel of their size.
    pub fn free(&mut self, ids: &[usize]) {
        for &id in ids {
            if let Some(slot) = self.values.get_mut(id) {
                *slot = None;
            }
        }
    }

    fn refs<const N: usize>(&self, ids: [usize; N]) -> Result<[&Tensor; N]> {
        let mut missing = None;
        let refs = ids.map(|id| {
            self.get(id).unwrap_or_else(|e| {
                missing.get_or_insert(e);
                placeholder()
            })
        });
        match missing {
            Some(e) => Err(e),
            None => Ok(refs),
        }
    }

    fn put<const M: usize>(&mut self, ids: [usize; M], values: [Tensor; M]) -> Result<()> {
        for (id, value) in ids.into_iter().zip(values) {
            self.set(id, value)?;
        }
        Ok(())
    }

    /// Node `id` by its core op's kernel (`ops::execute_into`, into its planned arena region
    /// when it has one), with output shape `shape`.
    pub fn kernel(
        &mut self,
        ops: &[Node],
        id: usize,
        args: &[usize],
        shape: &[usize],
        ctx: &mut Ctx,
    ) {
        let flops = |s: &Slots| match (ops.get(id).map(|n| &n.op), args.first()) {
            (Some(Op::MatMul), Some(&a)) => s.product_flops(a, shape),
            _ => 0,
        };
        self.timed("kernel", id, flops, |s| {
            let op = &ops
                .get(id)
                .ok_or_else(|| internal(format!("node {id} is not in the model's IR")))?
                .op;
            let mut inputs: smallvec::SmallVec<[&Tensor; 8]> = smallvec::SmallVec::new();
            for &a in args {
                inputs.push(s.get(a)?);
            }
            let region = if rtx_ir::memory::kernel_writes_into(op) {
                s.region(id, shape.iter().product())
            } else {
                None
            };
            let value = crate::ops::execute_into(op, &inputs, shape, region, ctx)?;
            drop(inputs);
            s.set(id, value)
        })
    }

    /// The schedule with fusion off (`Ctx::with_fusion(false)`): nodes `0..upto` of `f`, each
    /// by its own kernel ([`Slots::kernel`], as the fused schedule runs its unfused steps), in
    /// graph order, each value dropped after its last reader (`rtx_ir::memory::deaths`).
    /// Output shapes are the IR's, evaluated with `dims` (every symbol and generic parameter
    /// of the function's shapes). Inputs and parameters are in their slots already; constants
    /// are put in theirs here. The macro emits this call rather than a second unrolled
    /// schedule: an unfused mode exists to check the fused code against, and unrolled it
    /// doubled the code rustc compiles for every model.
    pub fn unfused(
        &mut self,
        f: &GraphFn,
        upto: usize,
        roots: &[usize],
        dims: &[(&str, i64)],
        ctx: &mut Ctx,
    ) {
        let upto = upto.min(f.graph.nodes.len());
        let env: HashMap<String, i64> = dims.iter().map(|&(n, v)| (n.to_string(), v)).collect();
        let mut steps = Vec::new();
        for (id, node) in f.graph.nodes.iter().enumerate().take(upto) {
            match &node.op {
                Op::Const { value } => self.constant(id, *value as f32),
                Op::Input { .. } | Op::Param { .. } => {}
                _ => steps.push(Step::Kernel(id)),
            }
        }
        let deaths = rtx_ir::memory::deaths(f, &steps, roots);
        let mut shape: smallvec::SmallVec<[usize; 6]> = smallvec::SmallVec::new();
        for (step, dead) in steps.iter().zip(&deaths) {
            let Step::Kernel(id) = *step else { continue };
            let node = &f.graph.nodes[id];
            shape.clear();
            for d in &node.shape {
                match d.eval(&env).and_then(|v| usize::try_from(v).ok()) {
                    Some(v) => shape.push(v),
                    None => {
                        self.step(|_| {
                            Err(internal(format!(
                                "dimension `{d}` of node {id} has no value at run time"
                            )))
                        });
                        return;
                    }
                }
            }
            self.kernel(&f.graph.nodes, id, &node.args, &shape, ctx);
            self.free(dead);
        }
    }

    /// A pointwise group (`fused::fused`): `outputs` computed from `inputs` by `body`.
    pub fn fused<const N: usize, const M: usize, F, G>(
        &mut self,
        inputs: [usize; N],
        outputs: [usize; M],
        shape: &[usize],
        body: Kernel<F, G>,
    ) where
        F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
        G: Fn([f32; N]) -> [f32; M] + Sync + Copy,
    {
        let node = outputs.first().copied().unwrap_or(0);
        with_body!(body, |body| self.timed(
            "fused",
            node,
            |_| 0,
            |s| {
                let regions = s.regions(outputs, [shape.iter().product(); M]);
                let values = fused::fused(s.refs(inputs)?, shape, regions, body)?;
                s.put(outputs, values)
            }
        ))
    }

    /// A pointwise group whose input `donor` dies here: its buffer may take output 0
    /// (`fused::fused_donating`).
    pub fn fused_donating<const N: usize, const M: usize, F, G>(
        &mut self,
        inputs: [usize; N],
        donor: usize,
        outputs: [usize; M],
        shape: &[usize],
        body: Kernel<F, G>,
    ) where
        F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
        G: Fn([f32; N]) -> [f32; M] + Sync + Copy,
    {
        let node = outputs.first().copied().unwrap_or(0);
        with_body!(body, |body| self.timed(
            "fused",
            node,
            |_| 0,
            |s| {
                // Output 0 is planned over the donor's buffer: claimed only if the donation fails.
                let n = shape.iter().product();
                let mut k = 0;
                let regions = outputs.map(|id| {
                    k += 1;
                    let over_donor = k == 1 && s.shares_buffer(id, donor);
                    (!over_donor).then(|| s.region(id, n)).flatten()
                });
                let mut donated = Some(s.take(donor)?);
                let mut missing = None;
                let args = inputs.map(|id| match donated.take_if(|_| id == donor) {
                    Some(t) => FusedArg::Donated(t),
                    None => FusedArg::Borrowed(s.get(id).unwrap_or_else(|e| {
                        missing.get_or_insert(e);
                        placeholder()
                    })),
                });
                if let Some(e) = missing {
                    return Err(e);
                }
                let values = fused::fused_donating(args, shape, regions, body)?;
                s.put(outputs, values)
            }
        ))
    }

    /// A group that only rounds node `input` to the call's precision: at f32 its value is
    /// passed on (`moved` when the input dies here) instead of copied.
    pub fn pass(&mut self, input: usize, output: usize, moved: bool) {
        self.timed(
            "pass",
            output,
            |_| 0,
            |s| {
                let value = if moved {
                    s.take(input)?
                } else {
                    s.get(input)?.clone()
                };
                s.set(output, value)
            },
        )
    }

    /// A row group (`fused::rows`).
    #[allow(clippy::too_many_arguments)]
    pub fn rows<const N: usize, const M: usize, F, G>(
        &mut self,
        inputs: [usize; N],
        outputs: [usize; M],
        shape: &[usize],
        varies: [bool; N],
        out_wide: [bool; M],
        body: Kernel<F, G>,
    ) where
        F: Fn(&[RowIn<'_>; N], usize, &mut [&mut [f32]; M], &mut [f32]) + Sync + Copy,
        G: Fn(&[RowIn<'_>; N], usize, &mut [&mut [f32]; M], &mut [f32]) + Sync + Copy,
    {
        let node = outputs.first().copied().unwrap_or(0);
        with_body!(body, |body| self.timed(
            "rows",
            node,
            |_| 0,
            |s| {
                let lens = rtx_backends::cpu::row_output_lens(shape, out_wide);
                let regions = s.regions(outputs, lens);
                let values = fused::rows(s.refs(inputs)?, shape, varies, out_wide, regions, body)?;
                s.put(outputs, values)
            }
        ))
    }

    /// `a @ b` with a pointwise epilogue over the product and `extras` (`fused::matmul_fused`).
    pub fn matmul_fused<const N: usize, const E: usize, const M: usize, F, G>(
        &mut self,
        a: usize,
        b: usize,
        extras: [usize; E],
        outputs: [usize; M],
        shape: &[usize],
        body: Kernel<F, G>,
    ) where
        F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
        G: Fn([f32; N]) -> [f32; M] + Sync + Copy,
    {
        let node = outputs.first().copied().unwrap_or(0);
        let flops = |s: &Slots| s.product_flops(a, shape);
        with_body!(body, |body| self.timed("matmul_fused", node, flops, |s| {
            let [a, b] = s.refs([a, b])?;
            let regions = s.regions(outputs, [shape.iter().product(); M]);
            let values = fused::matmul_fused(a, b, s.refs(extras)?, shape, regions, body)?;
            s.put(outputs, values)
        }))
    }

    /// [`Slots::matmul_fused`] for a group of shape `group_shape` that read the product of
    /// shape `shape` through a reshape (same elements in the same order): inputs of the
    /// group's shape are read reshaped to the product's, row broadcasts as their last axis,
    /// and the outputs take the group's shape.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_fused_as<const N: usize, const E: usize, const M: usize, F, G>(
        &mut self,
        a: usize,
        b: usize,
        extras: [usize; E],
        outputs: [usize; M],
        shape: &[usize],
        group_shape: &[usize],
        body: Kernel<F, G>,
    ) where
        F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
        G: Fn([f32; N]) -> [f32; M] + Sync + Copy,
    {
        let node = outputs.first().copied().unwrap_or(0);
        let flops = |s: &Slots| s.product_flops(a, shape);
        with_body!(body, |body| self.timed("matmul_fused", node, flops, |s| {
            let [a, b] = s.refs([a, b])?;
            let mut reshaped: smallvec::SmallVec<[Tensor; 4]> = smallvec::SmallVec::new();
            for t in s.refs(extras)? {
                reshaped.push(if t.shape() == group_shape {
                    t.reshape(shape)?
                } else {
                    let last = t.shape().last().copied().unwrap_or(1);
                    t.reshape(&[last])?
                });
            }
            let extra_refs: [&Tensor; E] = std::array::from_fn(|k| &reshaped[k]);
            let regions = s.regions(outputs, [shape.iter().product(); M]);
            let values = fused::matmul_fused(a, b, extra_refs, shape, regions, body)?;
            let mut failed = None;
            let values = values.map(|v| match v.reshape(group_shape) {
                Ok(shaped) => shaped,
                Err(e) => {
                    failed.get_or_insert(e);
                    v
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            s.put(outputs, values)
        }))
    }

    /// A weight gradient and its bias gradient from one GEMM (`fused::matmul_row_sums`).
    pub fn matmul_row_sums(
        &mut self,
        a: usize,
        b: usize,
        outputs: [usize; 2],
        product_shape: &[usize],
        sums_shape: &[usize],
    ) {
        let node = outputs[0];
        let flops = |s: &Slots| s.product_flops(a, product_shape);
        self.timed("matmul_row_sums", node, flops, |s| {
            let [a, b] = s.refs([a, b])?;
            let values = fused::matmul_row_sums(a, b, product_shape, sums_shape)?;
            s.put(outputs, values)
        })
    }
}

/// What an argument array holds where a slot was empty; never read: the caller returns the
/// error instead (arrays have no fallible `map` on stable Rust).
fn placeholder() -> &'static Tensor {
    static EMPTY: std::sync::OnceLock<Tensor> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Tensor::scalar(0.0))
}

fn internal(what: String) -> RtxError {
    RtxError::Invalid(format!(
        "internal error in a compiled schedule: {what}; please report this with the model"
    ))
}

#[cfg(test)]
mod tests;
