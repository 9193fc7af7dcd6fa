//! Dimension arithmetic on typenum unsigned integers.
//!
//! Every alias here is a type-level function: `ConvOut<U8, U3, U1, U1>` *is*
//! `U8`. Invalid arguments (a kernel larger than the padded input, a zero
//! stride, an uneven split) make the alias fail to resolve, with a
//! diagnostic that says which shape rule was broken.

use core::ops::{Add, Div, Rem, Sub};

use typenum::{Add1, B1, Bit, Diff, IsGreaterOrEqual, Mod, Prod, Quot, Sum, UInt, UTerm, Unsigned};

/// Bridge from a const generic to a typenum unsigned: `U<8>` is `typenum::U8`.
///
/// This is typenum's own alias (feature `const-generics`),
/// `pub type U<const N: usize> = <typenum::Const<N> as typenum::ToUInt>::Output;`,
/// re-exported rather than redefined so that `use rtx_shapes::*` and
/// `use typenum::*` together do not make `U` ambiguous.
///
/// Resolves for the values `typenum::Const<N>: ToUInt` covers (0..=1024 and
/// selected larger values; see typenum's `generic_const_mappings`). In a
/// generic context add the bounds `typenum::Const<N>: typenum::ToUInt` and
/// `U<N>: typenum::Unsigned`.
#[doc(inline)]
pub use typenum::U;

/// The run-time value of a typenum dimension.
#[inline(always)]
pub const fn dim_value<T: Unsigned>() -> usize {
    T::USIZE
}

/// Product of two dimensions (flatten / reshape): `Product<U2, U3>` is `U6`.
pub type Product<A, B> = Prod<A, B>;

/// Size of the concatenation of two dimensions: `Concat<U2, U3>` is `U5`.
pub type Concat<A, B> = Sum<A, B>;

/// `A + 2 * P`, the padded input size.
pub type Padded<In, Padding> = Sum<In, Sum<Padding, Padding>>;

/// Convolution output size `(In + 2*Padding - Kernel) / Stride + 1`.
///
/// Fails to resolve, with "convolution output size is below 1", when
/// `In + 2*Padding < Kernel`, and with "stride must be at least 1" when
/// `Stride` is `U0`.
///
/// With concrete dimensions it needs no bounds. Inside a function generic
/// over a dimension `D`, add the bound `D: ConvOutput<Kernel, Stride, Padding>`
/// (typenum arithmetic on an unknown number cannot be proven in general;
/// for plain equality of generic dimensions use [`crate::assert_same_dim`]).
///
/// ```
/// use rtx_shapes::{ConvOut, dim_value, typenum::{U1, U3, U28}};
/// assert_eq!(dim_value::<ConvOut<U28, U3, U1, U1>>(), 28);
/// ```
///
/// ```compile_fail,E0277
/// use rtx_shapes::{ConvOut, dim_value, typenum::{U0, U1, U2, U5}};
/// // 2 + 2*0 < 5: "convolution output size is below 1"
/// let _ = dim_value::<ConvOut<U2, U5, U1, U0>>();
/// ```
pub type ConvOut<In, Kernel, Stride, Padding> = <In as ConvOutput<Kernel, Stride, Padding>>::Output;

/// Pooling output size, same formula as [`ConvOut`].
pub type PoolOut<In, Kernel, Stride, Padding> = <In as PoolOutput<Kernel, Stride, Padding>>::Output;

/// `A / Parts`, defined only when `A % Parts == 0` (exact split / chunk).
///
/// ```compile_fail,E0277
/// use rtx_shapes::{ExactDiv, dim_value, typenum::{U3, U13}};
/// // "`U13` cannot be split into `U3` equal parts"
/// let _ = dim_value::<ExactDiv<U13, U3>>();
/// ```
pub type ExactDiv<A, Parts> = <A as SplitInto<Parts>>::Output;

/// `Numerator / Self` for a stride `Self >= 1`; `U0` is rejected.
///
/// Implemented only for non-zero typenum integers, so a zero stride fails
/// here, with this message, before any division by zero is attempted.
#[diagnostic::on_unimplemented(
    message = "stride must be at least 1, found `{Self}`",
    label = "a zero stride has no output size",
    note = "typenum writes numbers in binary: `UTerm` is 0, `UInt<UTerm, B1>` is 1"
)]
pub trait StrideDiv<Numerator> {
    /// `Numerator / Self`.
    type Output: Unsigned;
}

impl<Numerator, Rest: Unsigned, B: Bit> StrideDiv<Numerator> for UInt<Rest, B>
where
    Numerator: Div<UInt<Rest, B>>,
    Quot<Numerator, UInt<Rest, B>>: Unsigned,
{
    type Output = Quot<Numerator, UInt<Rest, B>>;
}

/// `(PaddedIn - Kernel) / Stride + 1`, selected by `Self`, the result of
/// `PaddedIn >= Kernel`; only the `B1` (true) case exists.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "convolution output size is below 1: padded input `{PaddedIn}` is smaller than kernel `{Kernel}`",
    label = "the kernel does not fit in the padded input",
    note = "a convolution needs `input + 2 * padding >= kernel`",
    note = "typenum writes numbers in binary, most significant bit first: `UInt<UInt<UTerm, B1>, B0>` is 2"
)]
pub trait ConvFits<PaddedIn, Kernel, Stride> {
    /// The output size.
    type Output: Unsigned;
}

impl<PaddedIn, Kernel, Stride> ConvFits<PaddedIn, Kernel, Stride> for B1
where
    PaddedIn: Sub<Kernel>,
    Stride: StrideDiv<Diff<PaddedIn, Kernel>>,
    <Stride as StrideDiv<Diff<PaddedIn, Kernel>>>::Output: Add<B1>,
    Add1<<Stride as StrideDiv<Diff<PaddedIn, Kernel>>>::Output>: Unsigned,
{
    type Output = Add1<<Stride as StrideDiv<Diff<PaddedIn, Kernel>>>::Output>;
}

/// As [`ConvFits`], for pooling windows.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "pooling output size is below 1: padded input `{PaddedIn}` is smaller than window `{Kernel}`",
    label = "the pooling window does not fit in the padded input",
    note = "pooling needs `input + 2 * padding >= window`",
    note = "typenum writes numbers in binary, most significant bit first: `UInt<UInt<UTerm, B1>, B0>` is 2"
)]
pub trait PoolFits<PaddedIn, Kernel, Stride> {
    /// The output size.
    type Output: Unsigned;
}

impl<PaddedIn, Kernel, Stride> PoolFits<PaddedIn, Kernel, Stride> for B1
where
    B1: ConvFits<PaddedIn, Kernel, Stride>,
{
    type Output = <B1 as ConvFits<PaddedIn, Kernel, Stride>>::Output;
}

/// Convolution output size of an input dimension; see [`ConvOut`].
pub trait ConvOutput<Kernel, Stride, Padding> {
    /// `(Self + 2*Padding - Kernel) / Stride + 1`.
    type Output: Unsigned;
}

impl<In, Kernel, Stride, Padding> ConvOutput<Kernel, Stride, Padding> for In
where
    Padding: Add<Padding>,
    In: Add<Sum<Padding, Padding>>,
    Padded<In, Padding>: IsGreaterOrEqual<Kernel>,
    <Padded<In, Padding> as IsGreaterOrEqual<Kernel>>::Output:
        ConvFits<Padded<In, Padding>, Kernel, Stride>,
{
    type Output = <<Padded<In, Padding> as IsGreaterOrEqual<Kernel>>::Output as ConvFits<
        Padded<In, Padding>,
        Kernel,
        Stride,
    >>::Output;
}

/// Pooling output size of an input dimension; see [`PoolOut`].
pub trait PoolOutput<Kernel, Stride, Padding> {
    /// `(Self + 2*Padding - Kernel) / Stride + 1`.
    type Output: Unsigned;
}

impl<In, Kernel, Stride, Padding> PoolOutput<Kernel, Stride, Padding> for In
where
    Padding: Add<Padding>,
    In: Add<Sum<Padding, Padding>>,
    Padded<In, Padding>: IsGreaterOrEqual<Kernel>,
    <Padded<In, Padding> as IsGreaterOrEqual<Kernel>>::Output:
        PoolFits<Padded<In, Padding>, Kernel, Stride>,
{
    type Output = <<Padded<In, Padding> as IsGreaterOrEqual<Kernel>>::Output as PoolFits<
        Padded<In, Padding>,
        Kernel,
        Stride,
    >>::Output;
}

/// Quotient of an exact division, selected by `Self`, the remainder; only
/// the `U0` case exists.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{A}` cannot be split into `{Parts}` equal parts",
    label = "the remainder `{Self}` is not zero",
    note = "an exact split needs the dimension to be a multiple of the number of parts",
    note = "typenum writes numbers in binary, most significant bit first: `UInt<UInt<UTerm, B1>, B0>` is 2"
)]
pub trait ZeroRemainder<A, Parts> {
    /// `A / Parts`.
    type Output: Unsigned;
}

impl<A, Parts> ZeroRemainder<A, Parts> for UTerm
where
    A: Div<Parts>,
    Quot<A, Parts>: Unsigned,
{
    type Output = Quot<A, Parts>;
}

/// Exact division of a dimension into `Parts` equal parts; see [`ExactDiv`].
pub trait SplitInto<Parts> {
    /// `Self / Parts`.
    type Output: Unsigned;
}

impl<A, Parts> SplitInto<Parts> for A
where
    Parts: SplitRem<A>,
    <Parts as SplitRem<A>>::Output: ZeroRemainder<A, Parts>,
{
    type Output = <<Parts as SplitRem<A>>::Output as ZeroRemainder<A, Parts>>::Output;
}

/// `A % Self` for a number of parts `Self >= 1`; `U0` is rejected.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{A}` cannot be split into zero parts",
    label = "the number of parts must be at least 1"
)]
pub trait SplitRem<A> {
    /// `A % Self`.
    type Output;
}

impl<A, Rest: Unsigned, B: Bit> SplitRem<A> for UInt<Rest, B>
where
    A: Rem<UInt<Rest, B>>,
{
    type Output = Mod<A, UInt<Rest, B>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use typenum::{U0, U1, U2, U3, U4, U5, U6, U8, U12, U13, U24, U28, assert_type_eq};

    assert_type_eq!(ConvOut<U8, U3, U1, U1>, U8);
    assert_type_eq!(ConvOut<U8, U3, U1, U0>, U6);
    assert_type_eq!(ConvOut<U28, U5, U1, U0>, U24);
    assert_type_eq!(ConvOut<U8, U3, U2, U1>, U4);
    assert_type_eq!(ConvOut<U3, U3, U1, U0>, U1);
    assert_type_eq!(PoolOut<U8, U2, U2, U0>, U4);
    assert_type_eq!(PoolOut<U5, U2, U2, U0>, U2);
    assert_type_eq!(ExactDiv<U12, U3>, U4);
    assert_type_eq!(ExactDiv<U12, U12>, U1);
    assert_type_eq!(ExactDiv<U0, U3>, U0);
    assert_type_eq!(Product<U2, U3>, U6);
    assert_type_eq!(Concat<U2, U3>, U5);
    assert_type_eq!(U<8>, U8);
    assert_type_eq!(U<13>, U13);

    #[test]
    fn values() {
        assert_eq!(dim_value::<ConvOut<U8, U3, U1, U1>>(), 8);
        assert_eq!(dim_value::<ConvOut<U28, U5, U1, U2>>(), 28);
        assert_eq!(dim_value::<PoolOut<U24, U2, U2, U0>>(), 12);
        assert_eq!(dim_value::<ExactDiv<U<768>, U<12>>>(), 64);
        assert_eq!(dim_value::<Product<U<28>, U<28>>>(), 784);
        assert_eq!(dim_value::<Concat<U<64>, U<32>>>(), 96);
        assert_eq!(dim_value::<U<1024>>(), 1024);
        assert_eq!(dim_value::<U0>(), 0);
    }

    #[test]
    fn const_bridge_in_generic_context() {
        fn via_const<const N: usize>() -> usize
        where
            typenum::Const<N>: typenum::ToUInt,
            U<N>: Unsigned,
        {
            dim_value::<U<N>>()
        }
        assert_eq!(via_const::<42>(), 42);
    }
}
