//! Every CPU kernel against a plain f64 loop written here, on seeded pseudo-random inputs read
//! through contiguous, permuted, broadcast and narrowed layouts.

mod common;

mod attention;
mod conv;
mod determinism;
mod elementwise;
mod fused;
mod index;
mod into;
mod matmul;
mod matmul_bf16;
mod matmul_f16;
mod pool;
mod random;
mod reduce;
mod rounding;
