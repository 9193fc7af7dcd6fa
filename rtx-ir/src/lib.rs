//! rtx-ir: the graph IR of RustyTorch++ and everything that reasons about it.
//!
//! In the map of DESIGN.md this crate sits between `rtx-shapes` and the macros: `rtx-macros`
//! runs it at compile time (shape inference with symbolic dimensions, reverse-mode autodiff),
//! and `rtx-core` runs the same op definitions at run time. An op is defined once, in
//! `op.rs` (name, arity, kind, cost), `infer.rs` (shape rule), `autodiff.rs` (backward rule)
//! and `reference.rs` (float64 reference semantics that every backend is tested against).

// Shape errors carry both shapes so the macro can word them; they are built only on the
// failure path, so their size does not matter to the success path.
#![allow(clippy::result_large_err)]

pub mod autodiff;
pub mod dim;
pub mod emit;
pub mod fusion;
pub mod graph;
pub mod infer;
pub mod library;
pub mod memory;
pub mod op;
pub mod reference;
pub mod rewrite;

pub use autodiff::{differentiate, float_leaves};
pub use dim::{Atom, Dim};
pub use graph::{GradOf, Graph, GraphFn, IR_VERSION, ModelIr, Node, NodeId};
pub use infer::{Obligation, ShapeError, ShapeErrorKind, Unifier, broadcast, fmt_shape, infer};
pub use op::{AutocastMode, Cmp, DType, Op, OpDef, OpKind, Precision, Shape};
