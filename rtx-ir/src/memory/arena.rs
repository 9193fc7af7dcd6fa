//! Placing a call's buffers in one arena: offsets by greedy size order over the buffers'
//! lives (`arena_offsets`), and the plan a compiled call writes its intermediates by
//! (`arena_plan`, read by `rtx-core/src/planned.rs`).

use super::{BufferLife, lives_and_owners, step_outputs};
use crate::fusion::Step;
use crate::graph::{GraphFn, NodeId};
use crate::op::{DType, Op};
use std::collections::HashMap;

/// Offsets in one arena for `lives`, in bytes, and the arena's size: largest buffer first,
/// each at the lowest offset that no buffer placed before it and alive at the same time
/// covers (TFLite's "greedy by size", within a few percent of the peak on typical graphs).
/// Offsets are multiples of `align`.
pub fn arena_offsets(lives: &[BufferLife], align: u128) -> (Vec<u128>, u128) {
    let align = align.max(1);
    let mut order: Vec<usize> = (0..lives.len()).collect();
    order.sort_by(|&a, &b| lives[b].bytes.cmp(&lives[a].bytes).then(a.cmp(&b)));
    let mut offsets = vec![0u128; lives.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut size = 0u128;
    let mut taken: Vec<(u128, u128)> = Vec::new();
    for &b in &order {
        let life = lives[b];
        taken.clear();
        taken.extend(
            placed
                .iter()
                .filter(|&&p| lives[p].first <= life.last && life.first <= lives[p].last)
                .map(|&p| (offsets[p], offsets[p] + lives[p].bytes)),
        );
        taken.sort_unstable();
        let mut at = 0u128;
        for &(lo, hi) in &taken {
            if at + life.bytes <= lo {
                break;
            }
            at = at.max(hi.div_ceil(align) * align);
        }
        offsets[b] = at;
        size = size.max(at + life.bytes);
        placed.push(b);
    }
    (offsets, size)
}

/// The single-op kernels that write their output into a buffer the caller gives
/// (`rtx-core`'s `ops::execute_into`), so that a compiled call can place it in its arena;
/// every other `Step::Kernel` takes its output from the buffer cache or returns a view.
pub fn kernel_writes_into(op: &Op) -> bool {
    matches!(
        op,
        // A reshape writes only when it copies a value that is not row-major (`views.rs`).
        Op::MatMul | Op::Attention { .. } | Op::AttentionGrad { .. } | Op::Reshape { .. }
    )
}

/// No arena buffer: the value comes from the buffer cache (or is a view, a leaf, a root).
pub const NO_BUFFER: u32 = u32::MAX;

/// Where a compiled call puts its intermediates in one arena: for each node, the buffer its
/// value is written to (`NO_BUFFER` for none), and each buffer's offset and length, in f32
/// elements (offsets 64-byte aligned).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArenaPlan {
    pub buffer_of: Vec<u32>,
    pub offsets: Vec<usize>,
    pub lens: Vec<usize>,
}

/// The arena plan for running `steps` of `f` with the symbols bound to `env`, where `passes`
/// marks the steps that pass their input on (see `lives_and_owners`). Placed are the f32
/// outputs of the steps whose kernels write into given buffers (pointwise and row groups,
/// matmul epilogues, the kernels of [`kernel_writes_into`]), except the buffers that hold a root: results outlive the call, so they
/// come from the buffer cache and the arena is free for the next call. `None` when a
/// dimension cannot be evaluated with `env` or a size overflows.
pub fn arena_plan(
    f: &GraphFn,
    steps: &[Step],
    roots: &[NodeId],
    env: &HashMap<String, i64>,
    passes: &[bool],
) -> Option<ArenaPlan> {
    let (lives, buffer_of) = lives_and_owners(f, steps, roots, env, passes)?;
    let mut placeable = vec![false; lives.len()];
    for (i, step) in steps.iter().enumerate() {
        let writes_into = match step {
            Step::Fused { .. } => !passes.get(i).copied().unwrap_or(false),
            Step::Rows { .. } | Step::MatMulEpilogue { .. } => true,
            Step::Kernel(id) => kernel_writes_into(&f.graph.node(*id).op),
            // Its outputs are a weight's and a bias's gradients: results, never placed.
            Step::MatMulRowSums { .. } => false,
        };
        for v in step_outputs(step) {
            if let Some(&b) = buffer_of.get(&v)
                && writes_into
                && lives[b].first == i
                && f.graph.node(v).dtype != DType::I64
            {
                placeable[b] = true;
            }
        }
    }
    for r in roots {
        if let Some(&b) = buffer_of.get(r) {
            placeable[b] = false;
        }
    }
    let chosen: Vec<usize> = (0..lives.len()).filter(|&b| placeable[b]).collect();
    let chosen_lives: Vec<BufferLife> = chosen.iter().map(|&b| lives[b]).collect();
    let (offsets, _) = arena_offsets(&chosen_lives, 64);
    let mut index_of = vec![NO_BUFFER; lives.len()];
    for (k, &b) in chosen.iter().enumerate() {
        index_of[b] = u32::try_from(k).ok()?;
    }
    let mut plan = ArenaPlan {
        buffer_of: vec![NO_BUFFER; f.graph.len()],
        offsets: Vec::with_capacity(chosen.len()),
        lens: Vec::with_capacity(chosen.len()),
    };
    for (life, offset) in chosen_lives.iter().zip(offsets) {
        plan.offsets.push(usize::try_from(offset / 4).ok()?);
        plan.lens.push(usize::try_from(life.bytes / 4).ok()?);
    }
    for (&v, &b) in &buffer_of {
        if let Some(slot) = plan.buffer_of.get_mut(v) {
            *slot = index_of[b];
        }
    }
    Some(plan)
}
