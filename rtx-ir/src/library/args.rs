//! The kinds of a library op's parameters (`Param`), as the user writes them, and the
//! arguments a call passes (`Args`), parsed by the macro in the same order.

use crate::graph::NodeId;
use crate::infer::ShapeError;
use crate::op::Shape;

/// One parameter of a user-facing op: how the user writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param {
    /// A tensor expression (a number literal becomes a constant).
    Tensor(&'static str),
    /// A list of tensor expressions, `[a, b, ..]`.
    Tensors(&'static str),
    /// A number literal; `Some(default)` when it may be left out.
    Number(&'static str, Option<f64>),
    /// A non-negative integer literal; optional (the lowering picks the default).
    Size(&'static str, bool),
    /// An axis of the first tensor (or of the first tensor of the list): an integer literal,
    /// negative ones counted from the end; `true` when required.
    Axis(&'static str, bool),
    /// Axes of the first tensor: one integer literal or a list `[0, 2]`; optional (absent
    /// means every axis) unless `true`.
    Axes(&'static str, bool),
    /// `keepdim`, `true` or `false`; absent means false.
    Flag(&'static str),
    /// A list of dimensions: literals, generic parameters, symbols and their products.
    Dims(&'static str),
}

impl Param {
    pub fn name(&self) -> &'static str {
        match *self {
            Param::Tensor(n)
            | Param::Tensors(n)
            | Param::Number(n, _)
            | Param::Size(n, _)
            | Param::Axis(n, _)
            | Param::Axes(n, _)
            | Param::Flag(n)
            | Param::Dims(n) => n,
        }
    }

    pub fn required(&self) -> bool {
        match *self {
            Param::Tensor(_) | Param::Tensors(_) | Param::Dims(_) => true,
            Param::Number(_, default) => default.is_none(),
            Param::Size(_, required) | Param::Axis(_, required) | Param::Axes(_, required) => {
                required
            }
            Param::Flag(_) => false,
        }
    }
}

/// A parsed argument, in the order of the op's parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Tensor(NodeId),
    Tensors(Vec<NodeId>),
    Number(f64),
    Size(Option<usize>),
    /// Axes already resolved against the tensor's rank (non-negative, in range); `None`: absent.
    Axes(Option<Vec<usize>>),
    Flag(bool),
    Dims(Shape),
}

/// A call's arguments; the accessors name what a lowering expects at each position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args(pub Vec<Arg>);

impl Args {
    /// The form of the simple ops: tensors, then number literals.
    pub fn new(tensors: &[NodeId], numbers: &[f64]) -> Args {
        let t = tensors.iter().map(|&t| Arg::Tensor(t));
        Args(t.chain(numbers.iter().map(|&n| Arg::Number(n))).collect())
    }

    fn wrong(i: usize, what: &str) -> ShapeError {
        ShapeError::invalid(i, format!("argument {i} should be {what}"))
    }

    pub fn tensor(&self, i: usize) -> Result<NodeId, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Tensor(t)) => Ok(*t),
            _ => Err(Self::wrong(i, "a tensor")),
        }
    }

    pub fn tensors(&self, i: usize) -> Result<&[NodeId], ShapeError> {
        match self.0.get(i) {
            Some(Arg::Tensors(t)) => Ok(t),
            _ => Err(Self::wrong(i, "a list of tensors")),
        }
    }

    pub fn number(&self, i: usize) -> Result<f64, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Number(n)) => Ok(*n),
            _ => Err(Self::wrong(i, "a number")),
        }
    }

    pub fn size(&self, i: usize) -> Result<Option<usize>, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Size(n)) => Ok(*n),
            _ => Err(Self::wrong(i, "an integer")),
        }
    }

    pub fn axes(&self, i: usize) -> Result<Option<&[usize]>, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Axes(a)) => Ok(a.as_deref()),
            _ => Err(Self::wrong(i, "axes")),
        }
    }

    /// A single required axis.
    pub fn axis(&self, i: usize) -> Result<usize, ShapeError> {
        match self.axes(i)? {
            Some([a]) => Ok(*a),
            _ => Err(Self::wrong(i, "one axis")),
        }
    }

    pub fn flag(&self, i: usize) -> Result<bool, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Flag(f)) => Ok(*f),
            _ => Err(Self::wrong(i, "`keepdim`, `true` or `false`")),
        }
    }

    pub fn dims(&self, i: usize) -> Result<&Shape, ShapeError> {
        match self.0.get(i) {
            Some(Arg::Dims(d)) => Ok(d),
            _ => Err(Self::wrong(i, "a list of dimensions")),
        }
    }
}
