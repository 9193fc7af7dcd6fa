//! CPU kernels: f32, rayon-parallel over outputs, bit-identical for every thread count.
//!
//! Every kernel reads its inputs through a [`Layout`] (strided, permuted, broadcast or offset
//! views all work) and returns a fresh contiguous row-major buffer.
//!
//! Validation: every public kernel checks its arguments before it touches them and returns a
//! [`KernelError`] instead of reading out of bounds or panicking: each layout lies inside its
//! buffer, the operands' shapes combine as the kernel needs (matmul inner dimensions, broadcast
//! operands, conv channels and windows, reduction axes, index ranges, ...) and the output's
//! element count fits in memory. The checks cost a few comparisons per call (no allocation
//! unless they fail). They are not the IR's shape rules, which rtx-core runs once before
//! calling in and which remain the source of truth for what an op means; `scalar`,
//! `broadcast_shape` and the kernel pickers are pure and check nothing.
//!
//! Determinism: no kernel splits work by thread count and no kernel uses atomics. Each output
//! element is produced by one task that sums its terms in a fixed order; where a single output
//! needs more than one task (very long reductions), the pieces have a fixed size and are combined
//! in piece order. Long reductions over a tensor axis accumulate
//! in f64; matmul and convolution accumulate in f32 like a BLAS would.

mod attention;
mod check;
mod columns;
mod conv;
mod elementwise;
mod fused;
mod gemm;
mod im2col;
mod index;
mod pool;
mod random;
mod reduce;
mod rows;
pub mod scalar;
mod simd;
mod stores;
mod strided;
mod topk;
mod window;

pub use crate::layout::Layout;
pub use attention::{attention, attention_grad, attention_grad_into, attention_into};
pub use check::{KResult, KernelError};
pub use conv::{
    ConvAlgorithm, conv2d, conv2d_grad_input, conv2d_grad_input_with, conv2d_grad_weight,
    conv2d_grad_weight_with, conv2d_with,
};
pub use elementwise::{BinaryOp, UnaryOp, binary, broadcast_shape, unary};
pub use fused::{map_fused, map_fused_in_place, map_fused_into};
pub use gemm::bf16::{Bf16Kernel, bf16_kernel, bf16_kernels, matmul_bf16, matmul_bf16_with};
pub use gemm::f16::matmul_f16;
pub use gemm::{
    GemmKernel, gemm_kernel, gemm_kernels, matmul, matmul_fused, matmul_fused_into, matmul_into,
    matmul_row_sums, matmul_with,
};
pub use index::{concat, gather_rows, pad_narrow, pick_last, pick_last_grad, scatter_add_rows};
pub use pool::{avg_pool2d, avg_pool2d_grad, max_pool2d, max_pool2d_grad};
pub use random::dropout_mask;
pub use reduce::{ReduceOp, argmax, max_grad, reduce, row_max, row_sum, sum_to};
pub use rows::{RowIn, map_rows, map_rows_into, row_output_lens};
pub use simd::{SimdLevel, set_simd_level, simd_level, simd_levels, simd_supported};
pub use strided::{to_contiguous, to_contiguous_into};
pub use topk::{top_k, top_k_grad};
