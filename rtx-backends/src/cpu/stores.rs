//! How fused maps write outputs far larger than the caches: which stores they use
//! ([`Stores`], chosen from the output size and the last-level cache) and the two store
//! paths (non-temporal blocks, non-temporal copies from a stack block).

use super::fused::LANES;

/// Output size from which stores avoid reading the lines they overwrite (a normal store's
/// read-for-ownership, a third more traffic for a map that reads one input). Below it,
/// outputs are small enough that those reads hit the cache.
pub(super) const STREAM_BYTES: usize = 32 << 20;

/// How a map's results reach its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stores {
    /// Plain stores: the outputs are small.
    Cached,
    /// Contiguous runs compute into a block on the stack and move it with `memcpy`, whose
    /// string moves write whole lines without reading them first, and the lines stay in the
    /// last-level cache for the next kernel. For outputs the last-level cache holds.
    Staged,
    /// The same blocks moved with non-temporal stores, which bypass the caches: when inputs
    /// and outputs together exceed the last-level cache, what is written would be evicted
    /// before anyone read it, and on Zen 3 (32 MiB L3) the 16M-value chain ran at 26-28 GB/s
    /// this way against 21-25 staged through `memcpy` (BENCHMARKS.md).
    NonTemporal,
}

impl Stores {
    pub(super) fn for_sizes(n: usize, inputs: usize, outputs: usize) -> Stores {
        let written = n.saturating_mul(outputs).saturating_mul(4);
        let moved = n.saturating_mul(inputs + outputs).saturating_mul(4);
        if written < STREAM_BYTES {
            Stores::Cached
        } else if moved > last_level_cache_bytes() {
            Stores::NonTemporal
        } else {
            Stores::Staged
        }
    }
}

/// Size of the largest cache level of CPU 0, read once from Linux's sysfs (`cache/index*`);
/// 32 MiB where it cannot be read. Only a store strategy depends on it, never a result.
fn last_level_cache_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let mut best = (0u32, 32usize << 20);
        for index in 0..16 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
            let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
            let (Some(level), Some(size)) = (read("level"), read("size")) else {
                continue;
            };
            let level: u32 = level.trim().parse().unwrap_or(0);
            let size = size.trim();
            let (digits, scale) = match size.strip_suffix('K') {
                Some(d) => (d, 1usize << 10),
                None => match size.strip_suffix('M') {
                    Some(d) => (d, 1 << 20),
                    None => (size, 1),
                },
            };
            if let Ok(v) = digits.parse::<usize>()
                && level > best.0
            {
                best = (level, v.saturating_mul(scale));
            }
        }
        best.1
    })
}

/// Writes one block of results. When `stream` is set and the destination is 16-byte aligned,
/// on x86-64 it uses non-temporal stores (SSE2, always present there): they skip the read
/// of the destination line a normal store does, which for a buffer much larger than the
/// caches saves a third of the memory traffic.
#[inline(always)]
pub(super) fn store_block(dst: &mut [f32], block: &[f32; LANES], stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && dst.len() == LANES && (dst.as_ptr() as usize) & 15 == 0 {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        // SAFETY: `dst` holds LANES = 8 writable floats starting at a 16-byte aligned address,
        // so both 4-float stores are in bounds and aligned; SSE2 is part of x86-64.
        unsafe {
            let p = dst.as_mut_ptr();
            _mm_stream_ps(p, _mm_loadu_ps(block.as_ptr()));
            _mm_stream_ps(p.add(4), _mm_loadu_ps(block.as_ptr().add(4)));
        }
        return;
    }
    let _ = stream;
    dst.copy_from_slice(block);
}

/// Copies `len` floats with non-temporal stores from the first 16-byte aligned address of
/// `dst` on (plain stores before it and for a tail shorter than 4).
///
/// # Safety
/// `src` and `dst` hold `len` floats and do not overlap.
#[inline(always)]
pub(super) unsafe fn stream_copy(src: *const f32, dst: *mut f32, len: usize) {
    // SAFETY: every index below is under `len`, inside both buffers (the caller's
    // contract); the streaming stores are at 16-byte aligned addresses; SSE is part of x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let mut i = 0;
        while i < len && (dst.add(i) as usize) & 15 != 0 {
            *dst.add(i) = *src.add(i);
            i += 1;
        }
        while i + 4 <= len {
            _mm_stream_ps(dst.add(i), _mm_loadu_ps(src.add(i)));
            i += 4;
        }
        while i < len {
            *dst.add(i) = *src.add(i);
            i += 1;
        }
    }
    // SAFETY: the caller's contract.
    #[cfg(not(target_arch = "x86_64"))]
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_copy_copies_every_value_at_any_alignment() {
        let src: Vec<f32> = (0..67).map(|i| i as f32 * 0.5 - 3.0).collect();
        for offset in 0..4 {
            for len in [0, 1, 3, 4, 5, 8, 13, 63] {
                let mut dst = vec![f32::NAN; 72];
                // SAFETY: `src` holds 67 >= len values, `dst` 72 >= offset + len, no overlap.
                unsafe { stream_copy(src.as_ptr(), dst.as_mut_ptr().add(offset), len) };
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a store fence has no preconditions.
                unsafe {
                    std::arch::x86_64::_mm_sfence()
                };
                assert_eq!(
                    &dst[offset..offset + len],
                    &src[..len],
                    "offset {offset} len {len}"
                );
                assert!(dst[offset + len..].iter().all(|v| v.is_nan()));
                assert!(dst[..offset].iter().all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn small_outputs_use_plain_stores_and_large_ones_avoid_reading_their_lines() {
        assert_eq!(Stores::for_sizes(1 << 20, 2, 1), Stores::Cached);
        assert_ne!(Stores::for_sizes(16 << 20, 1, 1), Stores::Cached);
        assert_eq!(Stores::for_sizes(usize::MAX / 2, 3, 2), Stores::NonTemporal);
    }
}
