//! One allocation for the intermediates of a compiled call, with each buffer at an offset the
//! compiler planned (`rtx_ir::memory::arena_offsets`): the call's buffers overlap in memory
//! wherever their lives do not overlap in time, so the arena holds about the schedule's peak,
//! where a cache of exact-size buffers (`pool`) holds, for every size, the most buffers of it
//! alive at once.
//!
//! Safety does not rest on the plan being right. Each planned buffer has a live flag; a
//! [`Region`] sets its flag when claimed and clears it when dropped (when the last tensor
//! reading it goes). [`Arena::claim`] hands out a region only when no buffer whose bytes
//! overlap it is live; otherwise it refuses, the caller takes a pool buffer instead and
//! [`fallbacks`] counts it (the models' tests assert it stays zero). So two live regions never
//! share a byte, whatever the schedule does at run time (a tensor kept past its planned death,
//! a call that fails half way), and a region that escapes the call keeps the arena alive
//! through its `Arc`.
//!
//! Hand-written rather than taken from an arena crate: bump and typed arenas (bumpalo,
//! typed-arena) free everything at once and cannot reuse a byte range while the arena lives,
//! which is the point here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Claims refused because an overlapping buffer was still live, since the program started.
static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many times a planned buffer could not be placed in its arena because a buffer sharing
/// its bytes was still alive (the buffer came from `pool` instead): zero when the run-time
/// schedule follows the compiler's liveness plan.
pub fn fallbacks() -> u64 {
    FALLBACKS.load(Ordering::Relaxed)
}

/// Where each buffer of a plan lies, in f32 elements, and which buffers share bytes with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Element offset of each buffer.
    pub offsets: Vec<usize>,
    /// Element count of each buffer.
    pub lens: Vec<usize>,
    /// Elements of the whole arena.
    pub size: usize,
    /// For buffer `b`, `overlaps[starts[b]..starts[b + 1]]` are the other buffers whose
    /// element ranges intersect its own.
    overlaps: Vec<u32>,
    starts: Vec<usize>,
}

impl Placement {
    /// The placement of buffers of `lens` elements at `offsets`; `None` when a buffer does
    /// not fit in `usize` arithmetic.
    pub fn new(offsets: Vec<usize>, lens: Vec<usize>) -> Option<Placement> {
        if offsets.len() != lens.len() || lens.len() > u32::MAX as usize {
            return None;
        }
        let mut ends = Vec::with_capacity(lens.len());
        for (&o, &l) in offsets.iter().zip(&lens) {
            ends.push(o.checked_add(l)?);
        }
        let size = ends.iter().copied().max().unwrap_or(0);
        // Sorted by start, each buffer's overlaps are the ones after it that start before it
        // ends: a sweep, so planning a 1500-node step stays cheap.
        let mut order: Vec<usize> = (0..lens.len()).filter(|&b| lens[b] > 0).collect();
        order.sort_by_key(|&b| offsets[b]);
        let mut pairs: Vec<Vec<u32>> = vec![Vec::new(); lens.len()];
        for (i, &a) in order.iter().enumerate() {
            for &b in &order[i + 1..] {
                if offsets[b] >= ends[a] {
                    break;
                }
                pairs[a].push(b as u32);
                pairs[b].push(a as u32);
            }
        }
        let mut starts = Vec::with_capacity(lens.len() + 1);
        let mut overlaps = Vec::new();
        for p in pairs {
            starts.push(overlaps.len());
            overlaps.extend(p);
        }
        starts.push(overlaps.len());
        Some(Placement {
            offsets,
            lens,
            size,
            overlaps,
            starts,
        })
    }

    fn overlapping(&self, b: usize) -> &[u32] {
        &self.overlaps[self.starts[b]..self.starts[b + 1]]
    }
}

/// One allocation laid out by a [`Placement`].
pub struct Arena {
    placement: Arc<Placement>,
    /// The storage, written only through live [`Region`]s (disjoint by construction).
    base: *mut f32,
    live: Box<[AtomicBool]>,
}

// SAFETY: the arena's memory is reached only through `Region`s, and `claim` never hands out
// two live regions that share an element (checked under `claim_lock`); the live flags are
// atomics.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        let size = self.placement.size;
        // SAFETY: `base` came from a boxed slice of `size` elements in `Arena::new`, and no
        // region is alive (each holds an `Arc` of the arena).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base, size)) });
    }
}

/// Serializes claims: checking that the overlapping buffers are dead and marking this one
/// live must be one step, or two threads could claim overlapping regions at once.
static CLAIM_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Arena {
    /// A zeroed arena for `placement` (the system hands out zeroed pages lazily).
    pub fn new(placement: Arc<Placement>) -> Arc<Arena> {
        let memory: Box<[f32]> = vec![0.0f32; placement.size].into_boxed_slice();
        crate::pool::count_allocated(placement.size);
        let base = Box::into_raw(memory) as *mut f32;
        let live = (0..placement.lens.len())
            .map(|_| AtomicBool::new(false))
            .collect();
        Arc::new(Arena {
            placement,
            base,
            live,
        })
    }

    pub fn placement(&self) -> &Arc<Placement> {
        &self.placement
    }

    /// Whether any region of this arena is still held.
    pub fn in_use(&self) -> bool {
        self.live.iter().any(|l| l.load(Ordering::Acquire))
    }

    /// Buffer `index` of the plan, unless it or a buffer sharing its bytes is live (counted
    /// in [`fallbacks`]) or `len` is not its planned length (a call whose shapes differ from
    /// the plan's: `None`, not counted).
    pub fn claim(self: &Arc<Arena>, index: usize, len: usize) -> Option<Region> {
        let p = &self.placement;
        if p.lens.get(index) != Some(&len) || len == 0 {
            return None;
        }
        let _guard = CLAIM_LOCK.lock().ok()?;
        let busy = self.live[index].load(Ordering::Acquire)
            || p.overlapping(index)
                .iter()
                .any(|&b| self.live[b as usize].load(Ordering::Acquire));
        if busy {
            FALLBACKS.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.live[index].store(true, Ordering::Release);
        Some(Region {
            arena: Arc::clone(self),
            index,
            // SAFETY: `offsets[index] + len <= size` (`Placement::new`).
            ptr: unsafe { self.base.add(p.offsets[index]) },
            len,
        })
    }
}

/// A claimed buffer of an [`Arena`]: `len` f32 values that no other live region shares.
pub struct Region {
    arena: Arc<Arena>,
    index: usize,
    ptr: *mut f32,
    len: usize,
}

// SAFETY: a region is the only live handle to its elements (`Arena::claim`); shared access
// hands out `&[f32]`, mutation needs `&mut Region`.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `ptr..ptr + len` lies in the arena, which this region keeps alive, and no
        // other live region covers any of it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Region(buffer {}, {} values)", self.index, self.len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.arena.live[self.index].store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers 0 and 1 share elements 4..8; buffer 2 lies apart.
    fn three_buffers() -> Arc<Arena> {
        let placement = Placement::new(vec![0, 4, 8], vec![8, 4, 4]).unwrap();
        Arena::new(Arc::new(placement))
    }

    #[test]
    fn overlapping_buffers_are_found_and_apart_ones_are_not() {
        let p = Placement::new(vec![0, 4, 8], vec![8, 4, 4]).unwrap();
        assert_eq!(p.overlapping(0), &[1]);
        assert_eq!(p.overlapping(1), &[0]);
        assert!(p.overlapping(2).is_empty());
        assert_eq!(p.size, 12);
    }

    #[test]
    fn a_claim_is_refused_while_a_buffer_sharing_its_bytes_is_live() {
        let arena = three_buffers();
        let before = fallbacks();
        let first = arena.claim(0, 8).unwrap();

        let refused = arena.claim(1, 4);
        let apart = arena.claim(2, 4);

        assert!(refused.is_none());
        assert!(apart.is_some());
        assert!(fallbacks() > before);
        drop(first);
        assert!(arena.claim(1, 4).is_some());
    }

    #[test]
    fn a_buffer_is_claimed_once_until_its_region_drops() {
        let arena = three_buffers();
        let held = arena.claim(2, 4).unwrap();
        assert!(arena.claim(2, 4).is_none());
        assert!(arena.in_use());
        drop(held);
        assert!(!arena.in_use());
        assert!(arena.claim(2, 4).is_some());
    }

    #[test]
    fn a_claim_of_the_wrong_length_or_an_unknown_buffer_is_refused() {
        let arena = three_buffers();
        assert!(arena.claim(0, 7).is_none());
        assert!(arena.claim(9, 4).is_none());
    }

    #[test]
    fn a_region_reads_back_what_was_written_and_outlives_its_arena_handle() {
        let arena = three_buffers();
        let mut r = arena.claim(2, 4).unwrap();
        drop(arena);
        r.as_mut_slice().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(r.as_slice(), &[1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn a_placement_whose_end_overflows_is_refused() {
        assert!(Placement::new(vec![usize::MAX], vec![2]).is_none());
        assert!(Placement::new(vec![0], vec![]).is_none());
    }
}
