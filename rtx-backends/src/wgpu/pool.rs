//! The device-memory cache of the wgpu backend: a dropped buffer goes back to a free list
//! of its size class, and the next buffer of that class takes it instead of allocating, as
//! PyTorch's caching allocator does (an allocation costs a driver call and, on a real GPU,
//! often a synchronization). Classes are powers of two up to 1 MiB and whole MiB above, so a
//! buffer wastes at most half of a small class and under 1 MiB of a large one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// At most this many bytes wait in the free lists; past it a dropped buffer is freed.
const CAP_BYTES: u64 = 1 << 30;

/// The byte size of the class holding `bytes`.
pub(crate) fn class_of(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    if bytes <= MIB {
        bytes.max(256).next_power_of_two()
    } else {
        bytes.div_ceil(MIB) * MIB
    }
}

#[derive(Default)]
struct FreeLists {
    by_class: HashMap<u64, Vec<::wgpu::Buffer>>,
    bytes: u64,
    /// While commands are recorded but not submitted, buffers dropped meanwhile wait here:
    /// a recorded dispatch may still read one, and a buffer handed out again would be
    /// overwritten by `write_buffer`, which the queue runs before the recorded commands.
    held: Option<Vec<(u64, ::wgpu::Buffer)>>,
    held_bytes: u64,
}

/// The free lists of one device, shared by its buffers (which give themselves back).
#[derive(Clone, Default)]
pub(crate) struct Pool(Arc<Mutex<FreeLists>>);

impl Pool {
    /// A free buffer of `class` bytes, if one waits.
    pub(crate) fn take(&self, class: u64) -> Option<::wgpu::Buffer> {
        let mut lists = self.0.lock().ok()?;
        let buffer = lists.by_class.get_mut(&class)?.pop()?;
        lists.bytes -= class;
        Some(buffer)
    }

    pub(crate) fn give_back(&self, class: u64, buffer: ::wgpu::Buffer) {
        if let Ok(mut lists) = self.0.lock() {
            let lists = &mut *lists;
            match lists.held.as_mut() {
                Some(held) => {
                    held.push((class, buffer));
                    lists.held_bytes += class;
                }
                None => lists.keep(class, buffer),
            }
        }
    }

    /// From now until [`Pool::release`], dropped buffers are held back from reuse.
    pub(crate) fn hold(&self) {
        if let Ok(mut lists) = self.0.lock()
            && lists.held.is_none()
        {
            lists.held = Some(Vec::new());
        }
    }

    /// The recorded commands are submitted: buffers held back become reusable.
    pub(crate) fn release(&self) {
        if let Ok(mut lists) = self.0.lock() {
            let lists = &mut *lists;
            for (class, buffer) in lists.held.take().unwrap_or_default() {
                lists.keep(class, buffer);
            }
            lists.held_bytes = 0;
        }
    }

    /// Bytes of dropped buffers held back until the recorded commands are submitted.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.0.lock().map(|l| l.held_bytes).unwrap_or(0)
    }

    /// Bytes waiting in the free lists.
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.0.lock().map(|l| l.bytes).unwrap_or(0)
    }
}

impl FreeLists {
    /// Puts `buffer` on its free list, or frees it when the lists are full.
    fn keep(&mut self, class: u64, buffer: ::wgpu::Buffer) {
        if self.bytes + class <= CAP_BYTES {
            self.bytes += class;
            self.by_class.entry(class).or_default().push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::class_of;

    #[test]
    fn size_classes_are_powers_of_two_then_whole_mebibytes() {
        assert_eq!(class_of(1), 256);
        assert_eq!(class_of(257), 512);
        assert_eq!(class_of(1 << 20), 1 << 20);
        assert_eq!(class_of((1 << 20) + 1), 2 << 20);
        assert_eq!(class_of((5 << 20) - 7), 5 << 20);
    }
}
