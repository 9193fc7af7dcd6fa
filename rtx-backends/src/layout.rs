//! Where a tensor's elements sit in its buffer: shape, strides (in elements) and offset.
//!
//! Views (transpose, permute, broadcast, narrow) only change the layout, never the buffer, so
//! every kernel reads its inputs through a `Layout` and is correct on strided and broadcast
//! inputs. Kernels always write contiguous (row-major) outputs.

use smallvec::{SmallVec, smallvec};

/// A shape or its strides. Up to six axes live inline, so building a layout (every kernel
/// output, every view) allocates nothing: a training step after the first allocates no memory.
pub type Dims = SmallVec<[usize; 6]>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: Dims,
    pub strides: Dims,
    pub offset: usize,
}

impl Layout {
    /// Row-major layout of a fresh buffer.
    pub fn contiguous(shape: &[usize]) -> Layout {
        let mut strides: Dims = smallvec![0; shape.len()];
        let mut acc = 1;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i];
        }
        Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: 0,
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// True when the elements are the buffer's `offset..offset+numel` in row-major order.
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i];
        }
        true
    }

    /// Reorders the axes: axis `i` of the result is axis `perm[i]` of `self`.
    /// The caller guarantees `perm` is a permutation of `0..rank`.
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// NumPy broadcast to `shape` (right-aligned; size-1 and missing axes get stride 0).
    /// The caller guarantees the shapes are broadcast-compatible.
    pub fn broadcast_to(&self, shape: &[usize]) -> Layout {
        let extra = shape.len() - self.shape.len();
        let mut strides: Dims = smallvec![0; shape.len()];
        for i in 0..self.shape.len() {
            strides[extra + i] = if self.shape[i] == 1 && shape[extra + i] != 1 {
                0
            } else {
                self.strides[i]
            };
        }
        Layout {
            shape: Dims::from_slice(shape),
            strides,
            offset: self.offset,
        }
    }

    /// Elements `start..start+len` along `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Layout {
        let mut out = self.clone();
        out.offset += start * self.strides[axis];
        out.shape[axis] = len;
        out
    }

    /// Buffer index of every element, in row-major order of `shape`.
    pub fn indices(&self) -> StridedIndex<'_> {
        StridedIndex::new(self)
    }
}

/// Iterates the buffer positions of a layout in row-major order without allocating per step.
pub struct StridedIndex<'a> {
    layout: &'a Layout,
    counter: Dims,
    next: Option<usize>,
}

impl<'a> StridedIndex<'a> {
    fn new(layout: &'a Layout) -> Self {
        let next = if layout.numel() == 0 {
            None
        } else {
            Some(layout.offset)
        };
        StridedIndex {
            layout,
            counter: smallvec![0; layout.rank()],
            next,
        }
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        let mut pos = current;
        let mut axis = self.layout.rank();
        loop {
            if axis == 0 {
                self.next = None;
                break;
            }
            axis -= 1;
            self.counter[axis] += 1;
            pos += self.layout.strides[axis];
            if self.counter[axis] < self.layout.shape[axis] {
                self.next = Some(pos);
                break;
            }
            pos -= self.layout.strides[axis] * self.counter[axis];
            self.counter[axis] = 0;
        }
        Some(current)
    }
}
