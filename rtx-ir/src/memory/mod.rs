//! Liveness over a kernel schedule: when each value dies, and the peak memory of a call.
//!
//! The generated code drops every intermediate right after the last step that reads it, so
//! its buffer returns to the runtime's buffer cache and the next kernel of that size reuses
//! it; `memory_report` computes what that schedule holds at its peak for given symbol values,
//! next to the sum of all intermediates (what an interpreter that keeps every value holds).
//!
//! Views (permute, broadcast, narrow, a concat's gradient slices) share their source's buffer:
//! they allocate nothing and keep the source alive while they are.

use crate::fusion::Step;
use crate::graph::{GraphFn, NodeId};
use crate::op::{DType, Op};
use std::collections::{HashMap, HashSet};

mod arena;
mod views;
pub use arena::{ArenaPlan, NO_BUFFER, arena_offsets, arena_plan, kernel_writes_into};

/// Ops whose result is a view of their first argument's buffer.
pub fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Permute { .. } | Op::BroadcastTo | Op::Narrow { .. } | Op::ConcatGrad { .. }
    )
}

/// The values each step computes, in order.
pub fn step_outputs(step: &Step) -> Vec<NodeId> {
    match step {
        Step::Kernel(id) => vec![*id],
        Step::MatMulRowSums { matmul, sums } => vec![*matmul, *sums],
        Step::Fused { outputs, .. }
        | Step::Rows { outputs, .. }
        | Step::MatMulEpilogue { outputs, .. } => outputs.clone(),
    }
}

/// The values each step reads.
fn step_inputs(f: &GraphFn, step: &Step) -> Vec<NodeId> {
    match step {
        Step::Kernel(id) => f.graph.node(*id).args.clone(),
        Step::Fused { inputs, .. } | Step::Rows { inputs, .. } => inputs.clone(),
        // The matmul is computed inside the step: it reads the matmul's operands instead.
        Step::MatMulEpilogue { matmul, inputs, .. } => {
            let mut read = f.graph.node(*matmul).args.clone();
            read.extend(&inputs[1..]);
            read
        }
        Step::MatMulRowSums { matmul, sums } => {
            let mut read = f.graph.node(*matmul).args.clone();
            read.extend(&f.graph.node(*sums).args);
            read
        }
    }
}

/// For each step, the values computed by earlier steps (or by it) that nothing after it reads:
/// the generated code drops them there. `roots` (the results) never die.
pub fn deaths(f: &GraphFn, steps: &[Step], roots: &[NodeId]) -> Vec<Vec<NodeId>> {
    let mut last_read: HashMap<NodeId, usize> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        for v in step_outputs(step) {
            last_read.entry(v).or_insert(i);
        }
        for v in step_inputs(f, step) {
            last_read.insert(v, i);
        }
    }
    // Only values a step computed are owned by the function; leaves belong to the caller. (A
    // value's last reader never comes before the step that computes it.)
    let computed: HashSet<NodeId> = steps.iter().flat_map(step_outputs).collect();
    let mut out = vec![Vec::new(); steps.len()];
    let mut dying: Vec<(NodeId, usize)> = last_read
        .into_iter()
        .filter(|(v, _)| !roots.contains(v) && computed.contains(v))
        .collect();
    dying.sort_unstable();
    for (v, i) in dying {
        out[i].push(v);
    }
    out
}

/// For each step, the input whose buffer takes the step's first output, if any: in a pointwise
/// group (`Step::Fused`), an intermediate of the group's shape and of f32 that no later step
/// reads and that owns its buffer (not a view, not a leaf: inputs and parameters belong to the
/// caller). The kernel reads each element of it just before overwriting it, so the output
/// needs no buffer of its own; at run time the buffer is taken only when no other tensor
/// shares it. `deaths` is [`deaths`] of the same steps.
pub fn donors(f: &GraphFn, steps: &[Step], deaths: &[Vec<NodeId>]) -> Vec<Option<NodeId>> {
    steps
        .iter()
        .zip(deaths)
        .map(|(step, dead)| {
            let Step::Fused {
                shape_of, inputs, ..
            } = step
            else {
                return None;
            };
            let shape = &f.graph.node(*shape_of).shape;
            inputs.iter().copied().find(|&a| {
                let node = f.graph.node(a);
                dead.contains(&a)
                    && !matches!(
                        node.op,
                        Op::Input { .. } | Op::Param { .. } | Op::Const { .. }
                    )
                    && !is_view(&node.op)
                    && !matches!(node.op, Op::Reshape { .. })
                    && node.dtype == DType::F32
                    && &node.shape == shape
            })
        })
        .collect()
}

/// What a call of a scheduled function holds in intermediate buffers, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    /// The most bytes alive at once when every value is dropped after its last read.
    pub peak_bytes: u128,
    /// Every intermediate's bytes added up: what keeping all values until the end holds.
    pub total_bytes: u128,
    /// What one arena holds when each buffer gets a fixed offset in it, placed greedily by
    /// size (largest first, at the lowest offset free for its whole life): at least
    /// `peak_bytes`, more by the gaps the placement leaves.
    pub arena_bytes: u128,
    /// What a cache of buffers keyed by exact size holds once a call has run (the runtime's
    /// `rtx_backends::pool`): for each size, the most buffers of it alive at once.
    pub cache_bytes: u128,
}

/// One buffer of a call: its size and the steps it is alive in (both ends included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferLife {
    pub bytes: u128,
    pub first: usize,
    pub last: usize,
}

/// The buffers that running `steps` of `f` allocates, with the symbols bound to `env`: one
/// per computed value that owns its storage (views share their source's; a donated output
/// its donor's, whose life it extends). A buffer read by a root lives to the last step.
/// `None` when a dimension cannot be evaluated with `env`.
pub fn buffer_lives(
    f: &GraphFn,
    steps: &[Step],
    roots: &[NodeId],
    env: &HashMap<String, i64>,
) -> Option<Vec<BufferLife>> {
    let passes = vec![false; steps.len()];
    Some(lives_and_owners(f, steps, roots, env, &passes)?.0)
}

/// [`buffer_lives`], with the steps where `passes` is true passing their one input on as
/// their one output (a rounding-only group at f32: the same tensor, no buffer of its own),
/// and the buffer each owning value lives in.
pub(crate) fn lives_and_owners(
    f: &GraphFn,
    steps: &[Step],
    roots: &[NodeId],
    env: &HashMap<String, i64>,
    passes: &[bool],
) -> Option<(Vec<BufferLife>, HashMap<NodeId, usize>)> {
    let bytes_of = |v: NodeId| value_bytes(f, v, env);
    let mut passed_on: HashMap<NodeId, NodeId> = HashMap::new();
    let row_major = views::row_major_values(f, steps, env, passes)?;
    // Kernels that return their argument's buffer: a reshape of a row-major value (any other
    // is copied), a stop-gradient, a rounding at f32 (`ops::execute` clones the tensor).
    for step in steps {
        if let Step::Kernel(id) = *step
            && let Some(&src) = f.graph.node(id).args.first()
        {
            let passes_on = match f.graph.node(id).op {
                Op::Reshape { .. } => row_major.get(&src).copied().unwrap_or(true),
                Op::StopGradient | Op::Autocast | Op::AutocastGrad => true,
                _ => false,
            };
            if passes_on {
                passed_on.insert(id, src);
            }
        }
    }
    for (step, _) in steps.iter().zip(passes).filter(|(_, p)| **p) {
        if let Step::Fused {
            inputs, outputs, ..
        } = step
            && let ([input], [output]) = (&inputs[..], &outputs[..])
        {
            passed_on.insert(*output, *input);
        }
    }
    let shares_buffer = |v: NodeId| is_view(&f.graph.node(v).op) || passed_on.contains_key(&v);
    // A view keeps its source's buffer: count the buffer as alive until its views die.
    let owner = |mut v: NodeId| {
        loop {
            if let Some(&src) = passed_on.get(&v) {
                v = src;
            } else if is_view(&f.graph.node(v).op) {
                match f.graph.node(v).args.first() {
                    Some(&src) => v = src,
                    None => break,
                }
            } else {
                break;
            }
        }
        v
    };
    let deaths = deaths(f, steps, roots);
    let end = steps.len().saturating_sub(1);
    let mut last_alias: HashMap<NodeId, usize> = HashMap::new();
    for (i, dead) in deaths.iter().enumerate() {
        for &v in dead {
            let e = last_alias.entry(owner(v)).or_insert(i);
            *e = (*e).max(i);
        }
    }
    for &r in roots {
        last_alias.insert(owner(r), end);
    }
    let donors = donors(f, steps, &deaths);
    // The buffer each owning value lives in, by index into `lives`.
    let mut buffer_of: HashMap<NodeId, usize> = HashMap::new();
    let mut lives: Vec<BufferLife> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let donated = donors[i].filter(|d| last_alias.get(d) == Some(&i));
        for (k, v) in step_outputs(step).into_iter().enumerate() {
            if shares_buffer(v) {
                continue;
            }
            let last = last_alias.get(&v).copied().unwrap_or(i).max(i);
            if k == 0
                && let Some(&b) = donated.as_ref().and_then(|d| buffer_of.get(d))
            {
                lives[b].last = lives[b].last.max(last);
                buffer_of.insert(v, b);
                continue;
            }
            buffer_of.insert(v, lives.len());
            lives.push(BufferLife {
                bytes: bytes_of(v)?,
                first: i,
                last,
            });
        }
    }
    for &r in roots {
        let o = owner(r);
        if let Some(&b) = buffer_of.get(&o) {
            buffer_of.insert(r, b);
        }
    }
    Some((lives, buffer_of))
}

/// The bytes of node `v`'s value, `None` when a dimension cannot be evaluated with `env`.
fn value_bytes(f: &GraphFn, v: NodeId, env: &HashMap<String, i64>) -> Option<u128> {
    let node = f.graph.node(v);
    let elems = node.shape.iter().try_fold(1u128, |n, d| {
        let d = u128::try_from(d.eval(env)?).ok()?;
        Some(n.saturating_mul(d))
    })?;
    let width = if node.dtype == DType::I64 { 8 } else { 4 };
    Some(elems.saturating_mul(width))
}

/// The memory of running `steps` of `f` with the symbols bound to `env` (e.g. `B = 256`).
/// `None` when a dimension cannot be evaluated with `env`.
pub fn memory_report(
    f: &GraphFn,
    steps: &[Step],
    roots: &[NodeId],
    env: &HashMap<String, i64>,
) -> Option<MemoryReport> {
    let lives = buffer_lives(f, steps, roots, env)?;
    let mut total_bytes = 0u128;
    for v in steps.iter().flat_map(step_outputs) {
        if !is_view(&f.graph.node(v).op) {
            total_bytes += value_bytes(f, v, env)?;
        }
    }
    let mut change = vec![0i128; steps.len() + 1];
    let mut by_size: HashMap<u128, Vec<i64>> = HashMap::new();
    for l in &lives {
        change[l.first] += l.bytes as i128;
        change[l.last + 1] -= l.bytes as i128;
        let counts = by_size
            .entry(l.bytes)
            .or_insert_with(|| vec![0; steps.len() + 1]);
        counts[l.first] += 1;
        counts[l.last + 1] -= 1;
    }
    let (mut live, mut peak) = (0i128, 0i128);
    for c in &change {
        live += c;
        peak = peak.max(live);
    }
    let cache_bytes = by_size
        .iter()
        .map(|(&bytes, counts)| {
            let (mut n, mut most) = (0i64, 0i64);
            for c in counts {
                n += c;
                most = most.max(n);
            }
            bytes * most as u128
        })
        .sum();
    Some(MemoryReport {
        peak_bytes: peak as u128,
        total_bytes,
        arena_bytes: arena_offsets(&lives, 64).1,
        cache_bytes,
    })
}

impl GraphFn {
    /// The results a call materializes: the output and, for a differentiated function, every
    /// gradient.
    pub fn roots(&self) -> Vec<NodeId> {
        let mut roots = vec![self.output];
        roots.extend(self.grads.iter().filter_map(|g| g.grad));
        roots
    }

    /// The memory of the fused schedule the macro generates for this function (forward and
    /// backward: what `<name>_and_grads` runs), with the symbols bound as in `symbols`.
    pub fn memory_report(&self, symbols: &[(&str, usize)]) -> Option<MemoryReport> {
        let env: HashMap<String, i64> = symbols
            .iter()
            .map(|(s, v)| Some((s.to_string(), i64::try_from(*v).ok()?)))
            .collect::<Option<_>>()?;
        let roots = self.roots();
        let steps = crate::fusion::plan(&self.graph, self.graph.len(), &roots);
        memory_report(self, &steps, &roots, &env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dim::Dim;
    use crate::graph::Graph;
    use crate::infer::Unifier;

    /// x -> exp -> matmul(., x) -> log -> matmul(., x): four [B, 4] intermediates in a row.
    fn chain() -> GraphFn {
        let (mut g, mut u) = (Graph::default(), Unifier::default());
        let x = g
            .push(
                Op::Input {
                    index: 0,
                    name: "x".into(),
                    shape: vec![Dim::sym("B"), Dim::known(4)],
                    dtype: DType::F32,
                },
                &[],
                &mut u,
            )
            .unwrap();
        let w = g
            .push(
                Op::Param {
                    name: "w".into(),
                    shape: vec![Dim::known(4), Dim::known(4)],
                },
                &[],
                &mut u,
            )
            .unwrap();
        let a = g.push(Op::Exp, &[x], &mut u).unwrap();
        let b = g.push(Op::MatMul, &[a, w], &mut u).unwrap();
        let c = g.push(Op::Log, &[b], &mut u).unwrap();
        let d = g.push(Op::MatMul, &[c, w], &mut u).unwrap();
        GraphFn {
            name: "f".into(),
            symbols: vec!["B".into()],
            forward_len: g.len(),
            graph: g,
            output: d,
            grads: Vec::new(),
        }
    }

    #[test]
    fn each_value_dies_after_its_last_reader() {
        let f = chain();
        let steps = crate::fusion::plan(&f.graph, f.graph.len(), &[f.output]);

        let deaths = deaths(&f, &steps, &[f.output]);

        // Steps: exp; the first matmul with log as its epilogue (the product itself is never
        // stored); the last matmul. exp dies at the first matmul, log at the last.
        assert_eq!(steps.len(), 3, "{steps:?}");
        assert_eq!(deaths, vec![vec![], vec![2], vec![4]]);
    }

    #[test]
    fn the_peak_holds_two_buffers_of_the_chain_not_three() {
        let f = chain();

        let report = f.memory_report(&[("B", 10)]).unwrap();

        // exp, log (the first product is fused into it) and the result.
        let one = 10 * 4 * 4;
        assert_eq!(report.total_bytes, 3 * one);
        assert_eq!(report.peak_bytes, 2 * one);
    }

    /// concat(x, x), then exp and a product of the two in one group.
    fn shared_product() -> GraphFn {
        let mut f = chain();
        let mut u = Unifier::default();
        let x = 0;
        let g = &mut f.graph;
        g.nodes.truncate(2);
        let a = g.push(Op::Concat { axis: 0 }, &[x, x], &mut u).unwrap();
        let b = g.push(Op::Exp, &[a], &mut u).unwrap();
        let c = g.push(Op::Mul, &[a, b], &mut u).unwrap();
        f.forward_len = g.len();
        f.output = c;
        f
    }

    #[test]
    fn a_group_writes_over_an_input_that_dies_in_it() {
        let f = shared_product();
        let steps = crate::fusion::plan(&f.graph, f.graph.len(), &[f.output]);
        let deaths = deaths(&f, &steps, &[f.output]);

        let donors = donors(&f, &steps, &deaths);

        // Steps: the concat; exp and mul in one group, which reads the concat last.
        assert_eq!(donors, vec![None, Some(2)], "{steps:?}");
        let report = f.memory_report(&[("B", 10)]).unwrap();
        let one = 2 * 10 * 4 * 4;
        assert_eq!(report.total_bytes, 2 * one);
        assert_eq!(
            report.peak_bytes, one,
            "the group's output reuses the concat's buffer"
        );
    }

    #[test]
    fn leaves_never_give_their_buffer() {
        let mut f = chain();
        let mut u = Unifier::default();
        f.graph.nodes.truncate(2);
        let e = f.graph.push(Op::Exp, &[0], &mut u).unwrap();
        f.output = e;
        f.forward_len = f.graph.len();
        let steps = crate::fusion::plan(&f.graph, f.graph.len(), &[f.output]);

        let donors = donors(&f, &steps, &deaths(&f, &steps, &[f.output]));

        assert!(donors.iter().all(Option::is_none), "{donors:?}");
    }

    #[test]
    fn the_arena_plan_places_fused_intermediates_and_never_a_result() {
        let f = chain();
        let steps = crate::fusion::plan(&f.graph, f.graph.len(), &[f.output]);
        let env: HashMap<String, i64> = [("B".to_string(), 10)].into();
        let passes = vec![false; steps.len()];

        let plan = arena_plan(&f, &steps, &[f.output], &env, &passes).unwrap();

        assert_eq!(plan.buffer_of[f.output], NO_BUFFER);
        let placed = plan.buffer_of.iter().filter(|&&b| b != NO_BUFFER).count();
        assert!(placed >= 2, "{plan:?}");
        assert!(plan.lens.iter().all(|&l| l == 40), "{plan:?}");
        // exp(x) is read by the step that writes log(exp(x) @ w): both alive there.
        assert_ne!(plan.offsets[0], plan.offsets[1], "{plan:?}");
    }

    /// exp(x), optionally permuted to [4, B], reshaped to add a unit axis, then exp again.
    fn reshaped(permuted: bool) -> (GraphFn, NodeId, NodeId) {
        let mut f = chain();
        let mut u = Unifier::default();
        let g = &mut f.graph;
        g.nodes.truncate(2);
        let a = g.push(Op::Exp, &[0], &mut u).unwrap();
        let (src, shape) = if permuted {
            let p = g
                .push(Op::Permute { perm: vec![1, 0] }, &[a], &mut u)
                .unwrap();
            (p, vec![Dim::known(4), Dim::sym("B"), Dim::known(1)])
        } else {
            (a, vec![Dim::sym("B"), Dim::known(4), Dim::known(1)])
        };
        let r = g.push(Op::Reshape { shape }, &[src], &mut u).unwrap();
        let out = g.push(Op::Exp, &[r], &mut u).unwrap();
        f.forward_len = g.len();
        f.output = out;
        (f, a, r)
    }

    fn plan_of(f: &GraphFn) -> ArenaPlan {
        let steps = crate::fusion::plan(&f.graph, f.graph.len(), &[f.output]);
        let env: HashMap<String, i64> = [("B".to_string(), 10)].into();
        let passes = vec![false; steps.len()];
        arena_plan(f, &steps, &[f.output], &env, &passes).unwrap()
    }

    #[test]
    fn a_reshape_of_a_permuted_value_copies_into_a_buffer_of_its_own() {
        let (f, exp, reshape) = reshaped(true);

        let plan = plan_of(&f);

        let (a, r) = (plan.buffer_of[exp], plan.buffer_of[reshape]);
        assert!(a != NO_BUFFER && r != NO_BUFFER, "{plan:?}");
        assert_ne!(a, r, "the copy is read while its source is alive: {plan:?}");
        assert_eq!(plan.lens[r as usize], 40);
    }

    #[test]
    fn a_reshape_of_a_row_major_value_shares_its_buffer() {
        let (f, exp, reshape) = reshaped(false);

        let plan = plan_of(&f);

        // The reshape writes nothing: only exp(x)'s buffer is placed.
        assert_eq!(plan.buffer_of[reshape], NO_BUFFER, "{plan:?}");
        assert_ne!(plan.buffer_of[exp], NO_BUFFER, "{plan:?}");
        assert_eq!(plan.lens.len(), 1, "{plan:?}");
    }

    #[test]
    fn an_unbound_symbol_gives_no_report() {
        assert!(chain().memory_report(&[]).is_none());
    }

    #[test]
    fn arena_offsets_never_overlap_two_buffers_alive_at_once() {
        // Arrange: lives from a fixed pseudo-random sequence.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let lives: Vec<BufferLife> = (0..300)
            .map(|_| {
                let first = next(100) as usize;
                BufferLife {
                    bytes: 1 + next(5000) as u128,
                    first,
                    last: first + next(20) as usize,
                }
            })
            .collect();

        let (offsets, size) = arena_offsets(&lives, 64);

        let peak = (0..120)
            .map(|t| {
                let alive = lives.iter().filter(|l| l.first <= t && t <= l.last);
                alive.map(|l| l.bytes).sum::<u128>()
            })
            .max()
            .unwrap();
        assert!(size >= peak);
        for (i, a) in lives.iter().enumerate() {
            assert_eq!(offsets[i] % 64, 0);
            assert!(offsets[i] + a.bytes <= size);
            for (j, b) in lives.iter().enumerate().skip(i + 1) {
                let together = a.first <= b.last && b.first <= a.last;
                let apart =
                    offsets[i] + a.bytes <= offsets[j] || offsets[j] + b.bytes <= offsets[i];
                assert!(!together || apart, "buffers {i} and {j} overlap");
            }
        }
    }

    #[test]
    fn the_chain_fits_an_arena_of_its_peak() {
        let f = chain();

        // 16 x 4 floats: buffers of 256 bytes, so offsets need no rounding up to 64.
        let report = f.memory_report(&[("B", 16)]).unwrap();

        assert_eq!(report.arena_bytes, report.peak_bytes);
        assert_eq!(report.cache_bytes, report.peak_bytes);
    }
}
