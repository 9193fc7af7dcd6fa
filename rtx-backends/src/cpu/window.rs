//! Sliding-window geometry shared by convolution and pooling (PyTorch conventions, floor mode).

use super::check::{self, KResult};

/// An `[N, C, H, W]` input scanned by a `kernel` window with `stride` and zero/`-inf` `padding`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window2d {
    pub batch: usize,
    pub channels: usize,
    pub in_size: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub out_size: [usize; 2],
}

impl Window2d {
    pub(crate) fn new(
        x_shape: &[usize],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Self {
        let in_size = [x_shape[2], x_shape[3]];
        // A window larger than the padded input leaves no output rather than underflowing.
        let out_size = std::array::from_fn(|d| {
            (in_size[d] + 2 * padding[d])
                .checked_sub(kernel[d])
                .map_or(0, |span| span / stride[d] + 1)
        });
        Window2d {
            batch: x_shape[0],
            channels: x_shape[1],
            in_size,
            kernel,
            stride,
            padding,
            out_size,
        }
    }

    /// The window of a kernel over an input of shape `x_shape`, refused unless the input has
    /// rank 4, the kernel and stride are nonzero, the kernel fits in the padded input, and the
    /// input and output element counts (both `channels` wide) fit in memory.
    pub(crate) fn checked(
        name: &'static str,
        x_shape: &[usize],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        out_channels: usize,
    ) -> KResult<Self> {
        check::shapes(name, x_shape.len() == 4, || {
            format!("the input has shape {x_shape:?}, not [N, C, H, W]")
        })?;
        check::argument(name, stride.iter().all(|&s| s > 0), || {
            format!("stride {stride:?} has a zero")
        })?;
        check::argument(name, kernel.iter().all(|&k| k > 0), || {
            format!("kernel size {kernel:?} has a zero")
        })?;
        for d in 0..2 {
            let fits = padding[d]
                .checked_mul(2)
                .and_then(|p| p.checked_add(x_shape[2 + d]))
                .is_some_and(|room| room >= kernel[d]);
            check::shapes(name, fits, || {
                format!(
                    "a kernel of {kernel:?} does not fit in the input {:?} padded by {padding:?}",
                    &x_shape[2..]
                )
            })?;
        }
        check::elements(name, x_shape)?;
        let window = Window2d::new(x_shape, kernel, stride, padding);
        check::elements(name, &window.out_shape(out_channels))?;
        Ok(window)
    }

    /// The outputs on axis `d` whose tap `tap` lands inside the input (not in the padding): the
    /// taps of one kernel offset are then a plain run of input elements, copied or added as a
    /// slice instead of tested one by one.
    #[inline]
    pub(crate) fn out_range(&self, d: usize, tap: usize) -> std::ops::Range<usize> {
        let (s, p, n) = (self.stride[d], self.padding[d], self.in_size[d]);
        // out * s + tap - p in [0, n)  <=>  out in [ceil((p - tap) / s), ceil((n + p - tap) / s))
        let lo = p.saturating_sub(tap).div_ceil(s);
        let hi = (n + p)
            .saturating_sub(tap)
            .div_ceil(s)
            .min(self.out_size[d]);
        lo.min(hi)..hi
    }

    pub(crate) fn in_plane(&self) -> usize {
        self.in_size[0] * self.in_size[1]
    }

    pub(crate) fn out_plane(&self) -> usize {
        self.out_size[0] * self.out_size[1]
    }

    pub(crate) fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }

    pub(crate) fn out_shape(&self, channels: usize) -> crate::layout::Dims {
        smallvec::smallvec![self.batch, channels, self.out_size[0], self.out_size[1]]
    }
}
