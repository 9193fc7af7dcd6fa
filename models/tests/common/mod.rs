//! Shared helpers of the models integration tests: a tiny seeded generator for fresh random
//! batches, and conversions from runtime tensors to float64 reference arrays.

#![allow(dead_code)]

use rtx_core::ir::reference::Array;
use rtx_core::{DType, Tensor};

/// Test-data generator over the runtime's own seeded `rtx_core::Rng` (splitmix64), so
/// failures reproduce on every platform.
pub struct Rng(rtx_core::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(rtx_core::Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// An index in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }

    /// A contiguous f32 tensor with elements uniform in [-2, 2), the range of standardized
    /// pixels.
    pub fn images(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec(
            (0..n).map(|_| (4.0 * self.unit() - 2.0) as f32).collect(),
            shape,
        )
        .unwrap()
    }

    /// `n` class labels in 0..10.
    pub fn labels(&mut self, n: usize) -> Tensor {
        Tensor::from_i64((0..n).map(|_| self.below(10) as i64).collect(), &[n]).unwrap()
    }
}

/// The logical (row-major) values of a tensor of either dtype as a float64 reference array.
pub fn to_array(t: &Tensor) -> Array {
    let data = match t.dtype() {
        DType::F32 | DType::BF16 | DType::F16 => {
            t.to_vec_f32().unwrap().into_iter().map(f64::from).collect()
        }
        DType::I64 => t
            .to_vec_i64()
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect(),
    };
    Array::new(t.shape().to_vec(), data)
}

/// The bit patterns of an f32 tensor, for exact comparisons.
pub fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}
