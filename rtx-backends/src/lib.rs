//! The backends' kernels: the arithmetic behind every tensor operation, one module per device.
//!
//! `cpu` is always built; `cuda` and `wgpu` will arrive as cargo features with the same kernel
//! set. rtx-core's `Tensor` calls these kernels after the IR's shape rules have accepted the
//! operation, so a kernel receives buffers plus [`Layout`]s (shape, strides, offset) and never
//! sees the IR: it trusts the shapes it is given and only does the arithmetic.

pub mod cpu;
pub mod layout;
pub mod pool;

pub use layout::Layout;
