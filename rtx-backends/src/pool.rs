//! A caching allocator for f32 buffers: kernels take their output buffers here, and rtx-core
//! gives a tensor's buffer back when its last reference drops.
//!
//! A training step allocates the same buffer sizes in the same order every step. Handing
//! them back and forth here keeps them off the system allocator, which for large buffers maps
//! fresh pages from the kernel each time (a page fault per 4 KiB on first write) and for every
//! buffer would need a zero-fill the kernel then overwrites. Buffers are keyed by exact length
//! (a step reuses exact sizes); the cache holds at most `CAP_BYTES`, beyond which buffers are
//! freed as usual. `RTX_POOL=0` turns caching off.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Bytes of every buffer `take` had to allocate, since the program started.
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

/// The bytes of all buffers the cache has allocated so far (a running total: what the
/// runtime's kernels have asked the system for, for benchmarks and memory reports). After a
/// training step's first call it stops growing.
pub fn allocated_bytes() -> u64 {
    ALLOCATED.load(Ordering::Relaxed)
}

/// Adds `len` f32 values allocated outside the cache (an `arena`) to [`allocated_bytes`].
pub(crate) fn count_allocated(len: usize) {
    ALLOCATED.fetch_add(len as u64 * 4, Ordering::Relaxed);
}

fn fresh(len: usize) -> Vec<f32> {
    count_allocated(len);
    vec![0.0; len]
}

/// At most this many bytes are kept for reuse.
const CAP_BYTES: usize = 1 << 30;

#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

fn pool() -> Option<&'static Mutex<Pool>> {
    static POOL: OnceLock<Option<Mutex<Pool>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let off = matches!(
            std::env::var("RTX_POOL").as_deref(),
            Ok("0") | Ok("off") | Ok("false")
        );
        (!off).then(|| Mutex::new(Pool::default()))
    })
    .as_ref()
}

fn reuse(len: usize) -> Option<Vec<f32>> {
    let mut p = pool()?.lock().ok()?;
    let v = p.free.get_mut(&len)?.pop()?;
    p.bytes -= len * 4;
    Some(v)
}

/// A buffer of `len` elements whose contents are unspecified (a recycled buffer keeps its old
/// values): for kernels that write every element.
pub fn take(len: usize) -> Vec<f32> {
    reuse(len).unwrap_or_else(|| fresh(len))
}

/// A buffer of `len` zeros.
pub fn take_zeroed(len: usize) -> Vec<f32> {
    match reuse(len) {
        Some(mut v) => {
            v.fill(0.0);
            v
        }
        None => fresh(len),
    }
}

/// A kernel's workspace buffer that goes back to the cache when dropped.
pub(crate) struct Scratch(pub(crate) Vec<f32>);

impl std::ops::Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

/// Keeps `buffer` for a later `take` of its length, or frees it when the cache is full.
pub fn give_back(buffer: Vec<f32>) {
    let len = buffer.len();
    if len == 0 || buffer.capacity() != len {
        return;
    }
    let Some(pool) = pool() else { return };
    let Ok(mut p) = pool.lock() else { return };
    if p.bytes + len * 4 > CAP_BYTES {
        return;
    }
    // No limit per length: a step's intermediates all come back by its end, so every
    // length's list reaches its largest size in the first step and never grows (i.e.
    // allocates) again. A limit of 16 made a GPT step free, and the next one allocate again,
    // the [B, T, C] buffers beyond the 16th (38 MiB per step at batch 32).
    let list = p.free.entry(len).or_default();
    list.push(buffer);
    p.bytes += len * 4;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_reused_for_the_same_length() {
        let v = vec![3.0f32; 12_345];
        let ptr = v.as_ptr();
        give_back(v);

        let again = take(12_345);

        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(again.len(), 12_345);
    }

    #[test]
    fn take_zeroed_clears_a_recycled_buffer() {
        give_back(vec![7.0f32; 23_456]);

        let v = take_zeroed(23_456);

        assert!(v.iter().all(|&x| x == 0.0));
    }
}
