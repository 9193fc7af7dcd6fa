//! Type-level dimensions and shape algebra for RustyTorch++ (rtx).
//!
//! A model's tensor shapes are checked in three ways. *Literal* dimensions
//! (`Linear(784, 128)`) are checked by the `graph!` macro itself, which can
//! point at the offending tokens with exact spans. *Generic* dimensions (a
//! model's `const IN: usize`) cannot be known by the macro, so its generated
//! code calls [`assert_same_dim`] inside the model's generic `impl`, and rustc
//! rejects a mismatch at `cargo check` time with the [`SameDim`] diagnostic.
//! *Symbolic* dimensions (the batch `B`, a sequence length) are bound at run
//! time. This crate provides the compile-time pieces: const-generic markers
//! ([`Dim`], [`SameDim`]), typenum dimension arithmetic ([`arith`]) and
//! type-level shapes ([`shape`]).
//!
//! Crate map: `rtx-shapes` <- `rtx-ir` <- `rtx-macros`; `rtx-core`
//! re-exports this crate as `rtx_core::shapes`. It depends only on
//! `typenum`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arith;
pub mod shape;

pub use arith::{Concat, ConvOut, ExactDiv, PoolOut, Product, U, dim_value};
pub use shape::{Numel, SameShape, Shape, TypeDim, assert_same_shape};
/// Re-export of the `typenum` version this crate is built against, so
/// generated code and downstream crates name the same types.
pub use typenum;

/// A dimension given by a const-generic value: `Dim<IN>`, `Dim<784>`.
///
/// Only used as a marker type in trait bounds; it has no run-time content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Dim<const N: usize>;

impl<const N: usize> Dim<N> {
    /// The dimension's value.
    pub const VALUE: usize = N;
}

/// Implemented only when two dimensions are equal *as types*.
///
/// `Dim<IN>: SameDim<Dim<IN>>` and `Dim<3>: SameDim<Dim<3>>` hold, while
/// `Dim<IN>: SameDim<Dim<HID>>` or `Dim<IN>: SameDim<Dim<3>>` do not, because
/// rustc cannot prove them for every value of the generic parameters.
#[diagnostic::on_unimplemented(
    message = "shape mismatch: expected dimension `{Rhs}`, found `{Self}`",
    label = "expected `{Rhs}`, found `{Self}`",
    note = "these dimensions must be equal for every value of the model's generic parameters",
    note = "a generic dimension only matches itself or the same literal; if the two are meant to be equal, use one parameter for both"
)]
pub trait SameDim<Rhs> {}

impl<const N: usize> SameDim<Dim<N>> for Dim<N> {}

/// Compile-time check that dimension `Found` equals dimension `Expected`.
///
/// Called by `graph!`'s generated code inside the model's generic impl, so
/// rustc checks it at `cargo check`. The first type argument is the
/// dimension actually produced (found), the second the one the consumer
/// expects.
///
/// ```
/// use rtx_shapes::{Dim, assert_same_dim};
/// fn layer<const IN: usize, const HID: usize>() {
///     assert_same_dim::<Dim<IN>, Dim<IN>>();
///     assert_same_dim::<Dim<3>, Dim<3>>();
/// }
/// ```
///
/// Two different generic parameters are rejected, even if they might be
/// instantiated with equal values:
///
/// ```compile_fail,E0277
/// use rtx_shapes::{Dim, assert_same_dim};
/// fn layer<const IN: usize, const HID: usize>() {
///     assert_same_dim::<Dim<IN>, Dim<HID>>();
/// }
/// ```
#[inline(always)]
pub const fn assert_same_dim<Found: SameDim<Expected>, Expected>() {}

#[cfg(test)]
mod tests {
    use super::*;

    // These compile only because the dimensions are equal.
    #[allow(dead_code)]
    fn generic_same<const IN: usize, const HID: usize>() {
        assert_same_dim::<Dim<IN>, Dim<IN>>();
        assert_same_dim::<Dim<HID>, Dim<HID>>();
        assert_same_dim::<Dim<3>, Dim<3>>();
    }

    const _: () = assert_same_dim::<Dim<7>, Dim<7>>();

    #[test]
    fn dim_value_const() {
        generic_same::<4, 5>();
        assert_eq!(Dim::<784>::VALUE, 784);
        assert_eq!(Dim::<0>::VALUE, 0);
    }
}
