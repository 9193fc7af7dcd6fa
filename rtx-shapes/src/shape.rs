//! Type-level shapes: tuples of dimensions, rank 0 to 6.
//!
//! A dimension is a typenum unsigned (`U28`, `arith::U<28>`) or a
//! const-generic [`Dim<N>`](crate::Dim); `(U2, U3)` is a 2x3 shape and `()`
//! is a scalar.

use core::ops::Mul;

use typenum::{Prod, U1, Unsigned};

use crate::Dim;

/// A type that stands for one dimension.
pub trait TypeDim {
    /// The dimension's value.
    const VALUE: usize;
}

impl<T: Unsigned> TypeDim for T {
    const VALUE: usize = T::USIZE;
}

impl<const N: usize> TypeDim for Dim<N> {
    const VALUE: usize = N;
}

/// A tuple of dimensions.
pub trait Shape {
    /// Number of dimensions.
    const RANK: usize;

    /// The dimension values, outermost first.
    fn dims() -> Vec<usize>;

    /// Number of elements (product of the dimensions; 1 for rank 0).
    /// Saturates at `usize::MAX` instead of overflowing.
    fn numel() -> usize {
        Self::dims()
            .into_iter()
            .fold(1usize, |acc, d| acc.saturating_mul(d))
    }
}

/// The element count of a typenum shape as a type: `Numel<(U2, U3, U4)>` is
/// `U24`, `Numel<()>` is `U1`.
pub type Numel<S> = <S as ShapeProduct>::Output;

/// Type-level product of a shape's typenum dimensions; see [`Numel`].
pub trait ShapeProduct {
    /// The product.
    type Output: Unsigned;
}

/// Implemented only when two shapes are equal as types.
#[diagnostic::on_unimplemented(
    message = "shape mismatch: expected shape `{Rhs}`, found `{Self}`",
    label = "expected `{Rhs}`, found `{Self}`",
    note = "both shapes must have the same rank and the same dimensions, in order",
    note = "typenum writes numbers in binary, most significant bit first: `UInt<UInt<UTerm, B1>, B0>` is 2"
)]
pub trait SameShape<Rhs> {}

impl<S: Shape> SameShape<S> for S {}

/// Compile-time check that shape `Found` equals shape `Expected`.
#[inline(always)]
pub const fn assert_same_shape<Found: SameShape<Expected>, Expected>() {}

impl Shape for () {
    const RANK: usize = 0;
    fn dims() -> Vec<usize> {
        Vec::new()
    }
}

impl ShapeProduct for () {
    type Output = U1;
}

macro_rules! impl_shape {
    ($rank:expr; $first:ident $(, $rest:ident)*) => {
        impl<$first: TypeDim $(, $rest: TypeDim)*> Shape for ($first, $($rest,)*) {
            const RANK: usize = $rank;
            fn dims() -> Vec<usize> {
                vec![$first::VALUE $(, $rest::VALUE)*]
            }
        }
    };
}

// Rank >= 2: first dimension times the product of the rest. (Rank 1 is
// written out: a where-clause on `Numel<()>` would be a projection on a
// concrete type, which rustc does not normalize inside the impl.)
macro_rules! impl_shape_product {
    ($first:ident, $($rest:ident),+) => {
        impl<$first, $($rest),+> ShapeProduct for ($first, $($rest,)+)
        where
            ($($rest,)+): ShapeProduct,
            $first: Mul<Numel<($($rest,)+)>>,
            Prod<$first, Numel<($($rest,)+)>>: Unsigned,
        {
            type Output = Prod<$first, Numel<($($rest,)+)>>;
        }
    };
}

impl<A: Unsigned> ShapeProduct for (A,) {
    type Output = A;
}

impl_shape!(1; A);
impl_shape!(2; A, B);
impl_shape!(3; A, B, C);
impl_shape!(4; A, B, C, D);
impl_shape!(5; A, B, C, D, E);
impl_shape!(6; A, B, C, D, E, F);

impl_shape_product!(A, B);
impl_shape_product!(A, B, C);
impl_shape_product!(A, B, C, D);
impl_shape_product!(A, B, C, D, E);
impl_shape_product!(A, B, C, D, E, F);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arith::{ConvOut, PoolOut, U};
    use typenum::{U0, U2, U3, U4, U5, U6, U7, U24, U720, assert_type_eq};

    assert_type_eq!(Numel<()>, U1);
    assert_type_eq!(Numel<(U7,)>, U7);
    assert_type_eq!(Numel<(U2, U3, U4)>, U24);
    assert_type_eq!(Numel<(U1, U2, U3, U4, U5, U6)>, U720);
    assert_type_eq!(Numel<(U2, U0, U4)>, U0);

    const _: () = assert_same_shape::<(U2, U3), (U2, U3)>();
    const _: () = assert_same_shape::<(U<2>, U<3>), (U2, U3)>();
    const _: () = assert_same_shape::<(Dim<2>, Dim<3>), (Dim<2>, Dim<3>)>();
    const _: () = assert_same_shape::<(), ()>();
    // The shape after conv 5x5 then 2x2 pool on a 28x28 image is 12x12.
    const _: () = assert_same_shape::<
        (
            PoolOut<ConvOut<U<28>, U5, U1, U0>, U2, U2, U0>,
            PoolOut<ConvOut<U<28>, U5, U1, U0>, U2, U2, U0>,
        ),
        (U<12>, U<12>),
    >();

    #[test]
    fn ranks() {
        assert_eq!(<() as Shape>::RANK, 0);
        assert_eq!(<(U2,) as Shape>::RANK, 1);
        assert_eq!(<(U2, U3) as Shape>::RANK, 2);
        assert_eq!(<(U1, U2, U3, U4, U5, U6) as Shape>::RANK, 6);
    }

    #[test]
    fn dims_and_numel() {
        assert_eq!(<() as Shape>::dims(), Vec::<usize>::new());
        assert_eq!(<() as Shape>::numel(), 1);
        assert_eq!(<(U2, U3, U4) as Shape>::dims(), vec![2, 3, 4]);
        assert_eq!(<(U2, U3, U4) as Shape>::numel(), 24);
        assert_eq!(<(U<784>, Dim<10>) as Shape>::dims(), vec![784, 10]);
        assert_eq!(<(U1, U2, U3, U4, U5, U6) as Shape>::numel(), 720);
        assert_eq!(<(Dim<{ usize::MAX }>, U2) as Shape>::numel(), usize::MAX);
        assert_eq!(crate::dim_value::<Numel<(U2, U3, U4)>>(), 24);
    }
}
