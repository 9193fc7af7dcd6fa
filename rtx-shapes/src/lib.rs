//! Type-level dimensions and shape algebra for RustyTorch++ (rtx).
//!
//! A model's tensor shapes are checked in three ways. *Literal* and *generic* dimensions
//! (`Linear<64, 128>`, a model's `const IN: usize`) are checked by the `graph!` macro itself,
//! which points at the offending tokens: a generic parameter equals only itself. Relations
//! over generic parameters that hold only for some of their values (`C*H*W == FLAT`) are
//! checked when the model is instantiated, by a constant whose message is assembled with
//! [`ConstMessage`]. *Symbolic* dimensions (the batch `B`, a sequence length) are bound at run
//! time. This crate also keeps type-level pieces for code that wants rustc to compare shapes:
//! const-generic markers ([`Dim`], [`DimEq`], [`SameDim`]), typenum dimension arithmetic
//! ([`arith`]) and type-level shapes ([`shape`]).
//!
//! Crate map: `rtx-shapes` <- `rtx-ir` <- `rtx-macros`; `rtx-core`
//! re-exports this crate as `rtx_core::shapes`. It depends only on
//! `typenum`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arith;
pub mod message;
pub mod shape;

pub use arith::{Concat, ConvOut, ExactDiv, PoolOut, Product, U, dim_value};
pub use message::ConstMessage;
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

/// The receiver of [`DimEq`] checks: `<DimCheck as DimEq<FOUND, EXPECTED>>::check()`.
///
/// `graph!` spans this type's path over the user's sub-expression, so rustc underlines
/// that expression when the check fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DimCheck;

/// Implemented only when the two const-generic dimensions are equal *as written*.
///
/// What `graph!` emits for each generic-dimension equality it cannot decide:
/// `<DimCheck as DimEq<{ HID }, { IN }>>::check();` inside the model's generic impl, so
/// rustc rejects a mismatch at `cargo check` with a message that names both dimensions
/// as the user wrote them (`expected dimension `IN`, found `HID``), not as type paths.
///
/// ```
/// use rtx_shapes::{DimCheck, DimEq};
/// fn layer<const IN: usize, const HID: usize>() {
///     <DimCheck as DimEq<IN, IN>>::check();
///     <DimCheck as DimEq<3, 3>>::check();
/// }
/// ```
///
/// ```compile_fail,E0277
/// use rtx_shapes::{DimCheck, DimEq};
/// fn layer<const IN: usize, const HID: usize>() {
///     <DimCheck as DimEq<HID, IN>>::check(); // shape mismatch: expected dimension `IN`, found `HID`
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "shape mismatch: expected dimension `{EXPECTED}`, found `{FOUND}`",
    label = "expected `{EXPECTED}`, found `{FOUND}`",
    note = "these dimensions must be equal for every value of the model's generic parameters",
    note = "a generic dimension only matches itself; if the two are meant to be equal, use one parameter for both"
)]
pub trait DimEq<const FOUND: usize, const EXPECTED: usize> {
    /// Does nothing; compiles only when `FOUND` and `EXPECTED` are the same dimension.
    #[inline(always)]
    fn check() {}
}

impl<const N: usize> DimEq<N, N> for DimCheck {}

/// Compile-time check that dimension `Found` equals dimension `Expected`.
///
/// The type-level form of [`DimEq`], for code that holds dimensions as [`Dim`] types; rustc
/// checks it at `cargo check`. The first type argument is the
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

    #[allow(dead_code)]
    fn generic_dim_eq<const IN: usize, const HID: usize>() {
        <DimCheck as DimEq<IN, IN>>::check();
        <DimCheck as DimEq<{ HID }, { HID }>>::check();
        <DimCheck as DimEq<4, 4>>::check();
    }

    #[test]
    fn dim_value_const() {
        generic_same::<4, 5>();
        assert_eq!(Dim::<784>::VALUE, 784);
        assert_eq!(Dim::<0>::VALUE, 0);
    }
}
