//! Shared helpers of the rtx-core integration tests: a tiny seeded generator for fresh random
//! inputs, conversions between runtime tensors and float64 reference arrays, and closeness
//! checks that name the element that disagrees.

#![allow(dead_code)]

use rtx_core::{DType, Tensor};
use rtx_ir::reference::Array;

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

    /// Uniform in [lo, hi), rounded to f32.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        (lo as f64 + (hi - lo) as f64 * self.unit()) as f32
    }

    /// An index in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// A contiguous f32 tensor with elements uniform in [-1, 1).
    pub fn tensor(&mut self, shape: &[usize]) -> Tensor {
        self.tensor_in(shape, -1.0, 1.0)
    }

    /// A contiguous f32 tensor with elements uniform in [lo, hi).
    pub fn tensor_in(&mut self, shape: &[usize], lo: f32, hi: f32) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec(self.vec(n, lo, hi), shape).unwrap()
    }

    /// Elements with magnitude in [lo, hi) and a random sign (safe denominators).
    pub fn tensor_away_from_zero(&mut self, shape: &[usize], lo: f32, hi: f32) -> Tensor {
        let n = shape.iter().product();
        let v = (0..n)
            .map(|_| {
                if self.next_u64() & 1 == 0 {
                    self.uniform(lo, hi)
                } else {
                    -self.uniform(lo, hi)
                }
            })
            .collect();
        Tensor::from_vec(v, shape).unwrap()
    }

    /// An i64 tensor with elements in 0..limit.
    pub fn ids(&mut self, shape: &[usize], limit: usize) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_i64((0..n).map(|_| self.below(limit) as i64).collect(), shape).unwrap()
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

/// Asserts `|got - want| <= atol + rtol * |want|` element by element.
pub fn assert_close(got: &[f64], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= atol + rtol * w.abs(),
            "{what}: element {i}: got {g}, want {w} (error {err:e})"
        );
    }
}
