//! The arena plans of compiled calls: for each graph function and each set of symbol values
//! it is called with (a batch size), where its intermediates lie in one arena
//! (`rtx_ir::memory::arena_plan`), computed on the first call and reused by every later one,
//! with the arenas of finished calls kept for the next.
//!
//! The plan is computed at run time because the models' shapes are symbolic (`B`): the
//! arena's size depends on the batch. It comes from the same fusion plan the macro emitted
//! the schedule from (`rtx_ir::fusion::plan` over the embedded IR), so the node ids match.
//! A function whose shapes are all static gets its plan at compile time instead: the macro
//! runs the same `arena_plan` at expansion and emits the offsets as constants
//! ([`StaticPlan`]), so the call reads its offsets rather than computing them.
//! `RTX_ARENA=0` turns arenas off (every buffer then comes from `rtx_backends::pool`).

use rtx_backends::arena::{Arena, Placement};
use rtx_ir::GraphFn;
use rtx_ir::memory::NO_BUFFER;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// At most this many plans are kept (one per function and batch size in use).
const PLANS: usize = 64;

/// At most this many idle arenas are kept per plan (one per thread running the function).
const SPARE_ARENAS: usize = 4;

/// Where one call's intermediates go, and the arenas laid out for it.
pub(crate) struct CallPlan {
    /// The arena buffer of each node's value (`NO_BUFFER`: none).
    buffer_of: Vec<u32>,
    placement: Arc<Placement>,
    spares: Mutex<Vec<Arc<Arena>>>,
}

impl CallPlan {
    /// The arena buffer node `id` is written to, if any.
    pub(crate) fn buffer(&self, id: usize) -> Option<usize> {
        match self.buffer_of.get(id) {
            Some(&b) if b != NO_BUFFER => Some(b as usize),
            _ => None,
        }
    }

    /// An idle arena for a call, or a fresh one (the first call on each thread).
    pub(crate) fn arena(&self) -> Arc<Arena> {
        let spare = self.spares.lock().ok().and_then(|mut s| s.pop());
        spare.unwrap_or_else(|| Arena::new(Arc::clone(&self.placement)))
    }

    /// Keeps a finished call's arena for the next call.
    pub(crate) fn give_back(&self, arena: Arc<Arena>) {
        if let Ok(mut spares) = self.spares.lock()
            && spares.len() < SPARE_ARENAS
        {
            spares.push(arena);
        }
    }

    /// Elements of the arena.
    pub(crate) fn arena_len(&self) -> usize {
        self.placement.size
    }
}

struct Entry {
    graph: usize,
    upto: usize,
    dims: Vec<i64>,
    plan: Arc<CallPlan>,
}

static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Whether compiled calls place their intermediates in arenas: true unless `RTX_ARENA` is
/// `0`, `off` or `false` when the first call runs.
pub fn arenas_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        !matches!(
            std::env::var("RTX_ARENA").as_deref(),
            Ok("0") | Ok("off") | Ok("false")
        )
    })
}

/// The plan for running nodes `0..upto` of `f` (results `roots`) with the symbols as in
/// `dims`; `None` when arenas are off or a shape cannot be evaluated. Looking up a known plan
/// allocates nothing.
pub(crate) fn plan_for(
    f: &GraphFn,
    upto: usize,
    roots: &[usize],
    dims: &[(&str, i64)],
) -> Option<Arc<CallPlan>> {
    if !arenas_enabled() {
        return None;
    }
    let graph = f as *const GraphFn as usize;
    let same = |e: &Entry| {
        e.graph == graph && e.upto == upto && e.dims.iter().copied().eq(dims.iter().map(|d| d.1))
    };
    {
        let cache = CACHE.lock().ok()?;
        if let Some(e) = cache.iter().find(|e| same(e)) {
            return Some(Arc::clone(&e.plan));
        }
    }
    let plan = Arc::new(compute(f, upto, roots, dims)?);
    let mut cache = CACHE.lock().ok()?;
    if cache.len() >= PLANS {
        cache.remove(0);
    }
    cache.push(Entry {
        graph,
        upto,
        dims: dims.iter().map(|d| d.1).collect(),
        plan: Arc::clone(&plan),
    });
    Some(plan)
}

fn compute(f: &GraphFn, upto: usize, roots: &[usize], dims: &[(&str, i64)]) -> Option<CallPlan> {
    let upto = upto.min(f.graph.nodes.len());
    let env: HashMap<String, i64> = dims.iter().map(|&(n, v)| (n.to_string(), v)).collect();
    let steps = rtx_ir::fusion::plan(&f.graph, upto, roots);
    let passes: Vec<bool> = steps.iter().map(|s| s.only_rounds()).collect();
    let plan = rtx_ir::memory::arena_plan(f, &steps, roots, &env, &passes)?;
    Some(CallPlan {
        buffer_of: plan.buffer_of,
        placement: Arc::new(Placement::new(plan.offsets, plan.lens)?),
        spares: Mutex::new(Vec::new()),
    })
}

/// An arena plan fixed at compile time: `#[model]` emits one as a `static` for each compiled
/// function whose shapes have no symbol (`rtx_ir::memory::arena_plan` run at expansion), and
/// the call lays out its arena from these offsets with no planning at run time.
pub struct StaticPlan {
    buffer_of: &'static [u32],
    offsets: &'static [usize],
    lens: &'static [usize],
    built: OnceLock<Option<Arc<CallPlan>>>,
}

impl StaticPlan {
    /// For each node the buffer its value goes to (`NO_BUFFER`: none), and each buffer's
    /// offset and length in f32 elements.
    pub const fn new(
        buffer_of: &'static [u32],
        offsets: &'static [usize],
        lens: &'static [usize],
    ) -> StaticPlan {
        StaticPlan {
            buffer_of,
            offsets,
            lens,
            built: OnceLock::new(),
        }
    }

    /// Each buffer's offset in the arena, in f32 elements, as the macro fixed them.
    pub fn offsets(&self) -> &'static [usize] {
        self.offsets
    }

    /// Each buffer's length, in f32 elements.
    pub fn lens(&self) -> &'static [usize] {
        self.lens
    }

    /// The arena buffer of each node (`rtx_ir::memory::NO_BUFFER`: none).
    pub fn buffer_of(&self) -> &'static [u32] {
        self.buffer_of
    }

    /// The call plan laid out from the constants, once per process; `None` when arenas are
    /// off or the constants overlap no valid placement (never for what the macro emits).
    pub(crate) fn call_plan(&self) -> Option<Arc<CallPlan>> {
        if !arenas_enabled() {
            return None;
        }
        let built = self.built.get_or_init(|| {
            let placement = Placement::new(self.offsets.to_vec(), self.lens.to_vec())?;
            Some(Arc::new(CallPlan {
                buffer_of: self.buffer_of.to_vec(),
                placement: Arc::new(placement),
                spares: Mutex::new(Vec::new()),
            }))
        });
        built.clone()
    }
}

/// The elements of the arena a call of nodes `0..upto` of `f` uses with the symbols as in
/// `dims` (what [`crate::slots::Slots::planned`] lays out), or `None` when arenas are off.
pub fn arena_bytes(
    f: &GraphFn,
    upto: usize,
    roots: &[usize],
    dims: &[(&str, i64)],
) -> Option<u128> {
    plan_for(f, upto, roots, dims).map(|p| p.arena_len() as u128 * 4)
}
