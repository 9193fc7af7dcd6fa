//! The backends' kernels: the arithmetic behind every tensor operation, one module per device.
//!
//! `cpu` is always built; `cuda` and `wgpu` will arrive as cargo features with the same kernel
//! set. rtx-core's `Tensor` calls these kernels after the IR's shape rules have accepted the
//! operation, so a kernel receives buffers plus [`Layout`]s (shape, strides, offset) and never
//! sees the IR. It still checks what it needs to be memory-safe and meaningful (layouts inside
//! their buffers, operand shapes that combine, indices in range) and returns a
//! [`cpu::KernelError`] for arguments it cannot use, so a misuse of this API is an error, not
//! an out-of-bounds access or a panic.

pub mod arena;
pub mod cpu;
pub mod layout;
pub mod pool;

pub use layout::Layout;
