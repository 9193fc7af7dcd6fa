//! Test helpers: a seeded RNG, layout-aware reads that do not use the crate's own iterators,
//! input builders for each kind of view, and tolerance checks.

#![allow(dead_code)]

use rtx_backends::Layout;

/// SplitMix64: tiny, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major multi-index of `linear` in `shape`.
pub fn unravel(mut linear: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for axis in (0..shape.len()).rev() {
        index[axis] = linear % shape[axis];
        linear /= shape[axis];
    }
    index
}

pub fn ravel(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// The logical values of a view, in row-major order, as f64.
pub fn read(data: &[f32], l: &Layout) -> Vec<f64> {
    (0..numel(&l.shape))
        .map(|linear| {
            let index = unravel(linear, &l.shape);
            let pos = l.offset
                + index
                    .iter()
                    .zip(&l.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            data[pos] as f64
        })
        .collect()
}

pub fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= atol + rtol * w.abs(),
            "{what}: element {i}: got {g}, want {w} (err {err:e})"
        );
    }
}

/// Kinds of view the kernels must read correctly.
#[derive(Clone, Copy, Debug)]
pub enum View {
    Contiguous,
    /// Axes stored in reverse order, then permuted back: every stride is "wrong".
    Reversed,
    /// Narrowed out of a larger buffer along axis 0: nonzero offset, gaps between rows.
    Narrowed,
    /// Axis 0 is broadcast (stride 0) from size 1.
    Broadcast,
}

pub const ALL_VIEWS: [View; 4] = [
    View::Contiguous,
    View::Reversed,
    View::Narrowed,
    View::Broadcast,
];

/// A buffer and a layout of `shape` of the given kind, filled by `fill` (called per stored element).
pub fn make_view(
    rng: &mut Rng,
    shape: &[usize],
    view: View,
    fill: &mut dyn FnMut(&mut Rng) -> f32,
) -> (Vec<f32>, Layout) {
    let rank = shape.len();
    match view {
        View::Contiguous => {
            let data = (0..numel(shape)).map(|_| fill(rng)).collect();
            (data, Layout::contiguous(shape))
        }
        View::Reversed => {
            let stored: Vec<usize> = shape.iter().rev().copied().collect();
            let data = (0..numel(shape)).map(|_| fill(rng)).collect();
            let perm: Vec<usize> = (0..rank).rev().collect();
            (data, Layout::contiguous(&stored).permute(&perm))
        }
        View::Narrowed => {
            // Wider on the last axis and longer on the first, then narrowed on both.
            let mut stored = shape.to_vec();
            stored[0] += 3;
            stored[rank - 1] += 2;
            let data = (0..numel(&stored)).map(|_| fill(rng)).collect();
            let layout = Layout::contiguous(&stored).narrow(0, 2, shape[0]).narrow(
                rank - 1,
                1,
                shape[rank - 1],
            );
            (data, layout)
        }
        View::Broadcast => {
            let mut stored = shape.to_vec();
            stored[0] = 1;
            let data = (0..numel(&stored)).map(|_| fill(rng)).collect();
            (data, Layout::contiguous(&stored).broadcast_to(shape))
        }
    }
}

pub fn random_view(rng: &mut Rng, shape: &[usize], view: View) -> (Vec<f32>, Layout) {
    make_view(rng, shape, view, &mut |r| r.uniform())
}

pub fn random_contiguous(rng: &mut Rng, shape: &[usize]) -> (Vec<f32>, Layout) {
    random_view(rng, shape, View::Contiguous)
}

/// The bit patterns of `values`, for exact comparisons.
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}
