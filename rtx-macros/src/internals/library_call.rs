//! Lowering a call of a library op (`rtx_ir::library`): the row gives the arguments and the
//! composition; this file checks the call against the row and reports a failed shape rule in
//! the user's terms, at the user's call.

use super::lower::{Lowerer, message};
use proc_macro2::TokenStream;
use quote::ToTokens;
use rtx_ir::library::{Emit, LibraryOp};
use rtx_ir::{NodeId, Op, Shape, ShapeError};

/// The lowering's view of the graph under construction.
struct Builder<'l, 'a> {
    lw: &'l mut Lowerer<'a>,
    whole: TokenStream,
    /// The value at fault in the last failed op, to point at the user's argument holding it.
    culprit: Option<NodeId>,
}

impl Emit for Builder<'_, '_> {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError> {
        self.lw
            .push_checked(op, args, &self.whole)
            .inspect_err(|e| {
                self.culprit = args.get(e.arg).copied();
            })
    }

    fn constant(&mut self, value: f64) -> NodeId {
        self.lw.konst(value)
    }

    fn shape(&self, value: NodeId) -> &Shape {
        &self.lw.graph.node(value).shape
    }

    fn same_shape(&mut self, expected: &Shape, found: &Shape) -> bool {
        let before = self.lw.u.obligations.len();
        let same = self.lw.u.same_shape(expected, found);
        self.lw.defer_obligations(before, &self.whole);
        same
    }
}

impl Lowerer<'_> {
    /// `def(tensors.., numbers..)`: `numbers` holds what the user wrote for the trailing number
    /// arguments (`None` where omitted); `arg_tokens` spans each argument for errors.
    pub(super) fn library_call(
        &mut self,
        def: &LibraryOp,
        tensors: &[NodeId],
        numbers: &[Option<f64>],
        whole: &dyn ToTokens,
        arg_tokens: &[&dyn ToTokens],
    ) -> Option<NodeId> {
        let callsite = format!("{}(..)", def.name);
        let mut values = Vec::with_capacity(def.numbers.len());
        for (i, (name, default)) in def.numbers.iter().enumerate() {
            match numbers.get(i).copied().flatten().or(*default) {
                Some(v) => values.push(v),
                None => {
                    self.cx.error_spanned_by(
                        whole,
                        format!(
                            "`{}` needs its `{name}` argument, a number literal\n\n= help: the form is `{}`",
                            def.name,
                            def.signature()
                        ),
                    );
                    return None;
                }
            }
        }
        let whole_tokens = whole.to_token_stream();
        let mut b = Builder {
            lw: self,
            whole: whole_tokens,
            culprit: None,
        };
        let lowered = (def.lower)(&mut b, tensors, &values);
        let culprit = b.culprit;
        match lowered {
            Ok(id) => Some(id),
            Err(err) => {
                // Underline the user's argument when the value at fault is one of them (a
                // core op's culprit, or the argument a lowering's own check names), else the
                // whole call.
                let at = match culprit {
                    Some(c) => tensors.iter().position(|&t| t == c),
                    None => Some(err.arg),
                }
                .and_then(|i| arg_tokens.get(i).copied())
                .unwrap_or(whole);
                self.cx
                    .error_spanned_by(at.to_token_stream(), message(&callsite, &err));
                None
            }
        }
    }

    /// `softmax(x, axis)` or `log_softmax(x, axis)`, whose axis the caller parsed: lowered by
    /// `rtx_ir::library::softmax`, the one definition of both.
    pub(super) fn library_softmax(
        &mut self,
        x: NodeId,
        axis: usize,
        log: bool,
        whole: &dyn ToTokens,
    ) -> Option<NodeId> {
        let callsite = if log {
            "log_softmax(..)"
        } else {
            "softmax(..)"
        };
        let whole_tokens = whole.to_token_stream();
        let mut b = Builder {
            lw: self,
            whole: whole_tokens.clone(),
            culprit: None,
        };
        match rtx_ir::library::softmax(&mut b, x, axis, log) {
            Ok(id) => Some(id),
            Err(err) => {
                self.cx
                    .error_spanned_by(whole_tokens, message(callsite, &err));
                None
            }
        }
    }
}
