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
}

impl Emit for Builder<'_, '_> {
    fn op(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError> {
        self.lw.push_checked(op, args, &self.whole)
    }

    fn constant(&mut self, value: f64) -> NodeId {
        self.lw.konst(value)
    }

    fn shape(&self, value: NodeId) -> &Shape {
        &self.lw.graph.node(value).shape
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
        };
        match (def.lower)(&mut b, tensors, &values) {
            Ok(id) => Some(id),
            Err(err) => {
                // The positions in `err` are the core op's, so the whole call is underlined.
                let _ = arg_tokens;
                self.cx.error_spanned_by(whole, message(&callsite, &err));
                None
            }
        }
    }
}
