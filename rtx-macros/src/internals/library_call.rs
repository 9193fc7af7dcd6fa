//! Lowering a call of a library op (`rtx_ir::library`): the row gives the arguments and the
//! composition; this file checks the call against the row and reports a failed shape rule in
//! the user's terms, at the user's call.

use super::lower::{Lowerer, message};
use proc_macro2::TokenStream;
use quote::ToTokens;
use rtx_ir::library::{Args, Emit, LibraryOp};
use rtx_ir::{NodeId, Op, Shape, ShapeError};

/// The lowering's view of the graph under construction.
struct Builder<'l, 'a> {
    lw: &'l mut Lowerer<'a>,
    whole: TokenStream,
    /// The op in the user's terms (`softmax(..)`), for obligations.
    site: String,
    /// The value at fault in the last failed op, to point at the user's argument holding it.
    culprit: Option<NodeId>,
    /// The parameter the lowering named as at fault (`Emit::blame`); wins over `culprit`.
    blamed: Option<usize>,
}

impl Emit for Builder<'_, '_> {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError> {
        self.lw
            .push_checked(op, args, &self.whole, &self.site)
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

    fn dtype(&self, value: NodeId) -> rtx_ir::DType {
        self.lw.graph.node(value).dtype
    }

    fn same_shape(&mut self, expected: &Shape, found: &Shape) -> bool {
        let before = self.lw.u.obligations.len();
        let same = self.lw.u.same_shape(expected, found);
        self.lw.defer_obligations(before, &self.whole, &self.site);
        same
    }

    fn blame(&mut self, param: usize) {
        self.blamed = Some(param);
    }
}

impl Lowerer<'_> {
    /// Lowers `def` on parsed arguments. `param_tokens[i]` spans the user's argument `i` (the
    /// whole call where it was left out) and `value_tokens` spans every tensor the user passed,
    /// list elements included, so an error points at the argument at fault.
    pub(super) fn library_call(
        &mut self,
        def: &LibraryOp,
        args: &Args,
        whole: &dyn ToTokens,
        param_tokens: &[TokenStream],
        value_tokens: &[(NodeId, TokenStream)],
    ) -> Option<NodeId> {
        let callsite = format!("{}(..)", def.name);
        let mut b = Builder {
            lw: self,
            whole: whole.to_token_stream(),
            site: callsite.clone(),
            culprit: None,
            blamed: None,
        };
        let lowered = (def.lower)(&mut b, args);
        let (culprit, blamed) = (b.culprit, b.blamed);
        match lowered {
            Ok(id) => Some(id),
            Err(err) => {
                // The parameter the lowering blamed, else the user's value that a failing core
                // op named, else the parameter the lowering's own check names; the whole call
                // when none of them is something the user wrote.
                let at = match (blamed, culprit) {
                    (Some(param), _) => param_tokens.get(param).cloned(),
                    (None, Some(c)) => {
                        // A rounded operand (`Op::Autocast`) stands for the value it rounds.
                        let node = self.graph.node(c);
                        let rounds = match (&node.op, node.args.as_slice()) {
                            (Op::Autocast, [x]) => Some(*x),
                            _ => None,
                        };
                        value_tokens
                            .iter()
                            .find(|(v, _)| *v == c)
                            .or_else(|| value_tokens.iter().find(|(v, _)| Some(*v) == rounds))
                            .map(|(_, t)| t.clone())
                    }
                    (None, None) => param_tokens.get(err.arg).cloned(),
                }
                .unwrap_or_else(|| whole.to_token_stream());
                self.cx.error_spanned_by(at, message(&callsite, &err));
                None
            }
        }
    }
}
