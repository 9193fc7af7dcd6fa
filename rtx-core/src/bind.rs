//! Run-time entry checks of a graph function: every input's dtype, rank and literal or
//! generic dims are checked, and symbolic dims (`B`) are bound on first use and checked on
//! every later use. A mismatch is an `RtxError::ShapeMismatch` naming both shapes.

use crate::error::{Result, RtxError};
use crate::tensor::{DType, Tensor, fmt_dims};

pub struct Binder {
    function: &'static str,
    /// Symbols bound so far; inline for the few a function has, so entry checks allocate
    /// nothing.
    bound: smallvec::SmallVec<[(&'static str, usize, &'static str); 4]>,
}

impl Binder {
    pub fn new(function: &'static str) -> Binder {
        Binder {
            function,
            bound: smallvec::SmallVec::new(),
        }
    }

    fn mismatch(&self, arg: &str, declared: &str, t: &Tensor, why: String) -> RtxError {
        RtxError::ShapeMismatch {
            context: format!("argument `{arg}` of `{}`", self.function),
            expected: format!("{declared}{why}"),
            found: fmt_dims(t.shape()),
        }
    }

    pub fn arg(
        &mut self,
        arg: &str,
        t: &Tensor,
        declared: &str,
        rank: usize,
        dtype: DType,
    ) -> Result<()> {
        if t.dtype() != dtype {
            return Err(RtxError::DTypeMismatch {
                context: format!("argument `{arg}` of `{}`", self.function),
                expected: dtype.to_string(),
                found: t.dtype().to_string(),
            });
        }
        if t.rank() != rank {
            return Err(self.mismatch(arg, declared, t, format!(" (rank {rank})")));
        }
        Ok(())
    }

    /// Binds symbol `sym` to `t.shape()[axis]`, or checks it against an earlier binding.
    pub fn bind(
        &mut self,
        arg: &'static str,
        t: &Tensor,
        declared: &str,
        axis: usize,
        sym: &'static str,
    ) -> Result<usize> {
        let v = t.shape()[axis];
        if let Some(&(_, prev, from)) = self.bound.iter().find(|(s, _, _)| *s == sym) {
            if prev != v {
                return Err(self.mismatch(
                    arg,
                    declared,
                    t,
                    format!(" with {sym} = {prev} (bound by argument `{from}`)"),
                ));
            }
            return Ok(v);
        }
        self.bound.push((sym, v, arg));
        Ok(v)
    }

    /// Checks that parameter `name` is an f32 tensor of shape `dims` (its declared shape
    /// `declared` with the generic values filled in).
    pub fn param(&mut self, name: &str, t: &Tensor, declared: &str, dims: &[usize]) -> Result<()> {
        let context = || format!("parameter `{name}` of `{}`", self.function);
        if t.dtype() != DType::F32 {
            return Err(RtxError::DTypeMismatch {
                context: context(),
                expected: DType::F32.to_string(),
                found: t.dtype().to_string(),
            });
        }
        if t.shape() != dims {
            let concrete = fmt_dims(dims);
            let expected = if concrete == declared {
                concrete
            } else {
                format!("{concrete} (declared {declared})")
            };
            return Err(RtxError::ShapeMismatch {
                context: context(),
                expected,
                found: fmt_dims(t.shape()),
            });
        }
        Ok(())
    }

    /// Checks `t.shape()[axis] == value`.
    pub fn expect(
        &mut self,
        arg: &str,
        t: &Tensor,
        declared: &str,
        axis: usize,
        value: usize,
    ) -> Result<()> {
        if t.shape()[axis] != value {
            let syms: Vec<String> = self
                .bound
                .iter()
                .map(|(s, v, _)| format!("{s} = {v}"))
                .collect();
            let why = if syms.is_empty() {
                String::new()
            } else {
                format!(" with {}", syms.join(", "))
            };
            return Err(self.mismatch(arg, declared, t, why));
        }
        Ok(())
    }
}
