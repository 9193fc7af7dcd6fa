//! The backends' kernels: the arithmetic behind every tensor operation, one module per device.
//!
//! `cpu` is always built; `wgpu` (feature `wgpu`) runs WGSL kernels emitted from the fusion
//! plan on Vulkan, Metal or DX12 (and on llvmpipe without a GPU); `cuda` (feature `cuda`)
//! runs their CUDA C with cuBLAS for products; `gpu` puts either behind one API for
//! rtx-core's device executor; `hip` compiles the same CUDA C as HIP. rtx-core's `Tensor`
//! calls these kernels after the IR's shape rules have accepted the
//! operation, so a kernel receives buffers plus [`Layout`]s (shape, strides, offset) and never
//! sees the IR. It still checks what it needs to be memory-safe and meaningful (layouts inside
//! their buffers, operand shapes that combine, indices in range) and returns a
//! [`cpu::KernelError`] for arguments it cannot use, so a misuse of this API is an error, not
//! an out-of-bounds access or a panic.

pub mod arena;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod gpu;
#[cfg(any(feature = "wgpu", feature = "cuda", feature = "hip"))]
pub mod gpu_error;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(any(feature = "wgpu", feature = "cuda", feature = "hip"))]
pub mod kernel_cache;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod kernel_meta;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod launch_abi;
pub mod layout;
pub mod pool;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use layout::Layout;
