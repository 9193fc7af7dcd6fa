//! The GEMM's packing buffers: packed B and the few-row panel per call, packed A per task.
//! None is allocated after warm-up, whichever thread drives a product or runs its tasks.

use std::cell::Cell;
use std::thread::LocalKey;

use super::{KC, MAX_ROW_PANELS};

/// Values of slack in a scratch buffer for aligning its start to 64 bytes.
pub(super) const ALIGN: usize = 16;
/// Scratch buffers larger than this are freed after use instead of kept.
const KEEP_SCRATCH: usize = 64 << 20;

thread_local! {
    /// The small B panel of the unpacked few-row path (`direct.rs`), which runs on the
    /// caller's thread.
    pub(super) static PACKED_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The largest packed A block of any kernel (`MAX_ROW_PANELS` panels of 14 rows by `KC`).
pub(super) const MAX_PACKED_A: usize = MAX_ROW_PANELS * 14 * KC;

/// The packed-A buffers, each `MAX_PACKED_A` (plus alignment slack) long so any task can use
/// any of them: slot `i + 1` is rayon worker `i`'s, slot 0 any other thread's. A task takes
/// its own thread's buffer when it is there, so the block it packs lands in memory already
/// in this core's cache; a buffer last written by the other core costs a transfer between
/// the caches per line (the small products of a training step spent more time there than in
/// the micro-kernel). A thread that needs a second buffer at once (a task run while it waits
/// in a join) takes any other. The first product fills every slot: which tasks run at the
/// same time, and where, varies from call to call, and buffers made on demand would appear
/// at whatever step first ran that many tasks together.
static PACKED_A: std::sync::Mutex<Vec<Option<Vec<f32>>>> = std::sync::Mutex::new(Vec::new());

/// Runs `f` on `len <= MAX_PACKED_A` values (contents unspecified) of a packed-A buffer that
/// starts on a 64-byte boundary.
pub(super) fn with_packed_a<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let fresh = || vec![0.0f32; MAX_PACKED_A + ALIGN];
    let home = rayon::current_thread_index().map_or(0, |i| i + 1);
    let taken = match PACKED_A.lock() {
        Ok(mut slots) => {
            if slots.is_empty() {
                let count = rayon::current_num_threads() + 2;
                slots.extend((0..count).map(|_| Some(fresh())));
            }
            let own = slots.get_mut(home).and_then(Option::take);
            own.or_else(|| slots.iter_mut().find_map(Option::take))
        }
        Err(_) => None,
    };
    let mut buffer = taken.unwrap_or_else(fresh);
    let skip = buffer.as_ptr().align_offset(64).min(ALIGN);
    let result = f(&mut buffer[skip..skip + len.min(MAX_PACKED_A)]);
    if let Ok(mut slots) = PACKED_A.lock() {
        let free = if slots.get(home).is_some_and(Option::is_none) {
            Some(home)
        } else {
            slots.iter().position(Option::is_none)
        };
        if let Some(i) = free {
            slots[i] = Some(buffer);
        }
    }
    result
}

/// Runs `f` on `len` values of this thread's scratch buffer `cell` (contents unspecified),
/// growing it to at least `min_len` when it must grow. The buffer is taken out of the cell
/// while `f` runs, so a nested call on the same thread (rayon can run another task while this
/// one waits) gets a fresh one instead of a conflict.
pub(super) fn with_scratch<R>(
    cell: &'static LocalKey<Cell<Vec<f32>>>,
    len: usize,
    min_len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    // 16 spare values, so the slice handed out can start on a 64-byte boundary: then every
    // 16-value row of a packed panel is one cache line, and no vector load splits two.
    let mut buffer = cell.with(Cell::take);
    if buffer.len() < len + ALIGN {
        buffer.resize(len.max(min_len) + ALIGN, 0.0);
    }
    let skip = buffer.as_ptr().align_offset(64).min(ALIGN);
    let result = f(&mut buffer[skip..skip + len]);
    if buffer.len() <= KEEP_SCRATCH {
        cell.with(|c| c.set(buffer));
    }
    result
}

/// Runs `f` on `len` values (contents unspecified) of a buffer from `crate::pool`, starting on
/// a 64-byte boundary, and gives the buffer back afterwards: the same sizes every step find
/// the same buffer, on any thread.
pub(super) fn with_cached_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buffer = crate::pool::Scratch(crate::pool::take(len + ALIGN));
    let skip = buffer.0.as_ptr().align_offset(64).min(ALIGN);
    f(&mut buffer.0[skip..skip + len])
}
