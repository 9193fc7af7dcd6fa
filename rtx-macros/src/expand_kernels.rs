//! The fused kernels of one model, each emitted once.
//!
//! A fused step's body is a closure that its driver (`rtx_core::fused::fused`, `rows`,
//! `matmul_fused`) is instantiated with, and every instantiation is compiled for each SIMD
//! level `simd::widest` offers and each loop shape of the driver. Repeated blocks, a forward
//! pass that `loss_and_grads` repeats, and graph functions sharing layers produce the same
//! body many times over; as distinct closures, rustc would compile each copy again (the
//! 4-block GPT's bodies were ~4x the distinct ones). Here each distinct body becomes one hidden
//! associated function returning its closure (`Self::__rtx_kernel_3(__cast)`), so every step
//! that runs it shares one closure type and one compiled driver.
//!
//! Bodies are compared after renaming their temporaries (`__t<node id>`) in order of first
//! appearance: the same ops on the same operands give the same tokens whatever node ids the
//! graph gave them.

use proc_macro2::{Group, Ident, TokenStream, TokenTree};
use quote::{format_ident, quote};
use rtx_ir::NodeId;
use rtx_ir::fusion::{Instr, Operand, RowInstr};
use std::collections::HashMap;

/// What the closure of a kernel takes and returns.
#[derive(Clone, Copy)]
pub enum Signature {
    /// `Fn([f32; inputs]) -> [f32; outputs]`: a pointwise group or a matmul epilogue.
    Pointwise { inputs: usize, outputs: usize },
    /// A row group's body (`rtx_core::fused::rows`).
    Rows { inputs: usize, outputs: usize },
}

/// The distinct kernel bodies of one model, in the order they were first met.
#[derive(Default)]
pub struct Kernels {
    items: Vec<TokenStream>,
    index: HashMap<String, usize>,
    /// Kernels by a key computed from the fusion group itself ([`Kernels::closure_keyed`]).
    by_key: HashMap<String, usize>,
}

impl Kernels {
    /// The expression that gives the closure of a body that `build` makes, registering it
    /// if no earlier step had it, where `key` (computed from the
    /// fusion group, see [`BodyKey`]) is equal for two groups only when their
    /// bodies are equal after renaming temporaries. A key met before gives its kernel without
    /// building the body again: token streams live in the compiler, and building, renaming
    /// and printing one for every step was most of a large model's expansion time.
    pub fn closure_keyed(
        &mut self,
        signature: Signature,
        key: String,
        build: impl FnOnce() -> (TokenStream, Option<TokenStream>),
    ) -> String {
        let key = format!("{}:{key}", signature.key());
        let k = match self.by_key.get(&key) {
            Some(&k) => k,
            None => {
                let (rounding, plain) = build();
                let k = self.register(signature, rounding, plain);
                self.by_key.insert(key, k);
                k
            }
        };
        format!("Self::{}(__cast)", kernel_name(k))
    }

    /// The index of `body`'s kernel, registered now if no earlier body had its tokens.
    /// `plain`, when given, is the body without its roundings, which calls at f32 run
    /// (`rtx_core::fused::Kernel`).
    fn register(
        &mut self,
        signature: Signature,
        body: TokenStream,
        plain: Option<TokenStream>,
    ) -> usize {
        let body = canonical_temporaries(body);
        let plain = plain.map(canonical_temporaries);
        let key = match &plain {
            Some(p) => format!("{}:{}|{}", signature.key(), body, p),
            None => format!("{}:{}", signature.key(), body),
        };
        let next = self.items.len();
        let k = *self.index.entry(key).or_insert(next);
        if k == next {
            let name = kernel_name(k);
            let ty = signature.return_type();
            let (ret, expr) = match plain {
                Some(plain) => (
                    quote!(::rtx_core::fused::Kernel<#ty, #ty>),
                    quote! {
                        if __cast.to == ::rtx_core::fused::scalar::HalfType::None {
                            ::rtx_core::fused::Kernel::Plain(#plain)
                        } else {
                            ::rtx_core::fused::Kernel::Rounding(#body)
                        }
                    },
                ),
                None => {
                    let never = signature.fn_pointer();
                    (
                        quote!(::rtx_core::fused::Kernel<#ty, #never>),
                        quote!(::rtx_core::fused::Kernel::Plain(#body)),
                    )
                }
            };
            self.items.push(quote! {
                #[doc(hidden)]
                #[inline(always)]
                #[allow(unused_variables, non_snake_case, clippy::all)]
                fn #name(__cast: ::rtx_core::fused::scalar::Rounding) -> #ret {
                    #expr
                }
            });
        }
        k
    }

    /// How many distinct kernels the model has.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The hidden associated functions, for the model's impl.
    pub fn items(&self) -> &[TokenStream] {
        &self.items
    }
}

impl Signature {
    fn key(self) -> String {
        match self {
            Signature::Pointwise { inputs, outputs } => format!("p{inputs}/{outputs}"),
            Signature::Rows { inputs, outputs } => format!("r{inputs}/{outputs}"),
        }
    }

    /// A function pointer type of the closure's signature: the unused `Rounding` half of a
    /// body that never rounds (one type per arity, so its driver is compiled once per arity).
    fn fn_pointer(self) -> TokenStream {
        match self {
            Signature::Pointwise { inputs, outputs } => {
                quote!(fn([f32; #inputs]) -> [f32; #outputs])
            }
            Signature::Rows { inputs, outputs } => quote! {
                fn(
                    &[::rtx_core::fused::RowIn<'_>; #inputs],
                    usize,
                    &mut [&mut [f32]; #outputs],
                    &mut [f32],
                )
            },
        }
    }

    fn return_type(self) -> TokenStream {
        match self {
            Signature::Pointwise { inputs, outputs } => {
                quote!(impl Fn([f32; #inputs]) -> [f32; #outputs] + Sync + Copy)
            }
            Signature::Rows { inputs, outputs } => quote! {
                impl Fn(
                    &[::rtx_core::fused::RowIn<'_>; #inputs],
                    usize,
                    &mut [&mut [f32]; #outputs],
                    &mut [f32],
                ) + Sync + Copy
            },
        }
    }
}

/// A fusion group's body written as plain text with its nodes numbered in order of first
/// appearance: two groups get the same key exactly when the closures that
/// `expand_schedule::pointwise_closure` or `expand_rows::row_closure` would emit for them are
/// the same after renaming temporaries (the key
/// holds everything those read: ops with their constants, operands, outputs, and for row
/// groups which inputs vary along the row and which outputs are wide). Computed without
/// building tokens, so a body repeated by every block of a model is built once.
#[derive(Default)]
pub struct BodyKey {
    nodes: HashMap<NodeId, usize>,
    text: String,
}

impl BodyKey {
    pub fn pointwise(body: &[Instr], outputs: &[NodeId]) -> String {
        let mut key = BodyKey::default();
        for i in body {
            key.instr(i);
        }
        key.outputs(outputs);
        key.text
    }

    pub fn rows(
        body: &[RowInstr],
        outputs: &[NodeId],
        varies: &[bool],
        out_wide: &[bool],
    ) -> String {
        let mut key = BodyKey::default();
        key.text.push_str(&format!("{varies:?}{out_wide:?}"));
        for step in body {
            match step {
                RowInstr::Map { instr, wide } => {
                    key.text.push_str(if *wide { "w" } else { "s" });
                    key.instr(instr);
                }
                RowInstr::Reduce { node, op, arg } => {
                    key.node(*node);
                    key.text.push_str(&format!("={op:?}"));
                    key.operand(arg);
                    key.text.push(';');
                }
            }
        }
        key.outputs(outputs);
        key.text
    }

    fn node(&mut self, n: NodeId) {
        let next = self.nodes.len();
        let k = *self.nodes.entry(n).or_insert(next);
        self.text.push_str(&format!("t{k}"));
    }

    fn operand(&mut self, o: &Operand) {
        match o {
            Operand::Input(i) => self.text.push_str(&format!(",i{i}")),
            Operand::Node(n) => {
                self.text.push(',');
                self.node(*n);
            }
            Operand::Const(c) => self.text.push_str(&format!(",c{:x}", c.to_bits())),
            Operand::RowLen => self.text.push_str(",len"),
        }
    }

    fn instr(&mut self, i: &Instr) {
        self.node(i.node);
        self.text.push_str(&format!("={:?}", i.op));
        for a in &i.args {
            self.operand(a);
        }
        self.text.push(';');
    }

    fn outputs(&mut self, outputs: &[NodeId]) {
        self.text.push_str("->");
        for &o in outputs {
            self.node(o);
            self.text.push(',');
        }
    }
}

fn kernel_name(k: usize) -> Ident {
    format_ident!("__rtx_kernel_{}", k)
}

/// `body` with every `__t<digits>` renamed `__t0`, `__t1`, .. in order of first appearance.
fn canonical_temporaries(body: TokenStream) -> TokenStream {
    fn walk(ts: TokenStream, names: &mut HashMap<String, usize>) -> TokenStream {
        ts.into_iter()
            .map(|tt| match tt {
                TokenTree::Ident(id) => {
                    let s = id.to_string();
                    let temporary = s
                        .strip_prefix("__t")
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
                    if temporary {
                        let next = names.len();
                        let k = *names.entry(s).or_insert(next);
                        TokenTree::Ident(Ident::new(&format!("__t{k}"), id.span()))
                    } else {
                        TokenTree::Ident(id)
                    }
                }
                TokenTree::Group(g) => {
                    let mut inner = Group::new(g.delimiter(), walk(g.stream(), names));
                    inner.set_span(g.span());
                    TokenTree::Group(inner)
                }
                other => other,
            })
            .collect()
    }
    walk(body, &mut HashMap::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAIR: Signature = Signature::Pointwise {
        inputs: 2,
        outputs: 1,
    };

    #[test]
    fn bodies_that_differ_only_in_node_ids_share_one_kernel() {
        let mut kernels = Kernels::default();
        let a = kernels.register(
            PAIR,
            quote!(move |[__i0, __i1]: [f32; 2]| {
                let __t7 = add(__i0, __i1);
                [__t7]
            }),
            None,
        );
        let b = kernels.register(
            PAIR,
            quote!(move |[__i0, __i1]: [f32; 2]| {
                let __t91 = add(__i0, __i1);
                [__t91]
            }),
            None,
        );
        assert_eq!(a, b);
        assert_eq!(kernels.len(), 1);
    }

    #[test]
    fn different_bodies_get_different_kernels() {
        let mut kernels = Kernels::default();
        let a = kernels.register(
            PAIR,
            quote!(move |[__i0, __i1]: [f32; 2]| {
                let __t7 = add(__i0, __i1);
                [__t7]
            }),
            None,
        );
        let b = kernels.register(
            PAIR,
            quote!(move |[__i0, __i1]: [f32; 2]| {
                let __t7 = mul(__i0, __i1);
                [__t7]
            }),
            None,
        );
        assert_ne!(a, b);
        assert_eq!(kernels.len(), 2);
    }

    #[test]
    fn the_same_body_under_another_signature_is_another_kernel() {
        let mut kernels = Kernels::default();
        let body = quote!(move |__in, __cols, __out, __scratch| {});
        kernels.register(PAIR, body.clone(), None);
        kernels.register(
            Signature::Rows {
                inputs: 2,
                outputs: 1,
            },
            body,
            None,
        );
        assert_eq!(kernels.len(), 2);
    }

    #[test]
    fn a_body_with_a_plain_version_is_another_kernel_than_the_body_alone() {
        let mut kernels = Kernels::default();
        let body = quote!(move |[__i0, __i1]: [f32; 2]| {
            let __t3 = autocast(__i0, __cast);
            [__t3]
        });
        let plain = quote!(move |[__i0, __i1]: [f32; 2]| {
            let __t3 = __i0;
            [__t3]
        });
        let alone = kernels.register(PAIR, body.clone(), None);
        let with_plain = kernels.register(PAIR, body, Some(plain));
        assert_ne!(alone, with_plain);
        assert_eq!(kernels.len(), 2);
    }

    #[test]
    fn only_numbered_temporaries_are_renamed() {
        let out = canonical_temporaries(quote!(__t5 __t __tx __i3 { __t9 __t5 }));
        assert_eq!(
            out.to_string(),
            quote!(__t0 __t __tx __i3 { __t1 __t0 }).to_string()
        );
    }
}
