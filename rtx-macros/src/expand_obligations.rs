//! Instantiation-time shape checks: relations over a model's generic parameters that hold
//! for some values only, emitted as tests in its `RTX_SHAPE_CHECKS` constant.

use crate::internals::ast::ModelStruct;
use crate::internals::lower::Obligation;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use rtx_ir::{Atom, Dim};

/// Each relation over generic dimensions becomes a test in the model's `RTX_SHAPE_CHECKS`
/// constant, which every graph method reads: when the model is instantiated (`Cnn::<3, 256>`),
/// rustc evaluates it, and a relation that fails stops the build with a message naming the
/// model, the parameters' values and the op, spanned at the user's expression. Each relation
/// is tested once (where it first arose).
pub fn emit_obligations(model: &ModelStruct, obligations: &[Obligation]) -> TokenStream {
    let mut out = TokenStream::new();
    let mut seen: Vec<String> = Vec::new();
    let params = &model.const_params;
    let model_name = model.name.to_string();
    let mut instance = quote!(.text(#model_name));
    for (i, p) in params.iter().enumerate() {
        let sep = if i == 0 { "<" } else { ", " };
        let label = format!("{sep}{p} = ");
        instance.extend(quote!(.text(#label).int(#p as i128)));
    }
    if !params.is_empty() {
        instance.extend(quote!(.text(">")));
    }
    for o in obligations {
        let key = format!("{:?}", o.relation);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let site = &o.site;
        let first = o
            .tokens
            .clone()
            .into_iter()
            .next()
            .map(|t| t.span())
            .unwrap_or_else(Span::call_site);
        let check = match &o.relation {
            rtx_ir::Obligation::Equal(a, b) => {
                let (ea, eb) = (const_dim_expr(a), const_dim_expr(b));
                let head = format!("shape mismatch in `{site}` of `");
                let (ta, tb) = (
                    format!("`: `{a}` must equal `{b}`, but here `{a}` = "),
                    format!(" and `{b}` = "),
                );
                // Mixed-site locals: a const parameter named `a` keeps its meaning in `#instance`.
                let (a_id, b_id, m_id) = (
                    syn::Ident::new("a", Span::mixed_site()),
                    syn::Ident::new("b", Span::mixed_site()),
                    syn::Ident::new("m", Span::mixed_site()),
                );
                quote_spanned! {first=>
                    let (#a_id, #b_id): (i128, i128) = (#ea, #eb);
                    if #a_id != #b_id {
                        let #m_id = ::rtx_core::shapes::ConstMessage::new().text(#head) #instance .text(#ta).int(#a_id).text(#tb).int(#b_id);
                        ::core::panic!("{}", #m_id.as_str());
                    }
                }
            }
            rtx_ir::Obligation::Positive(d) => {
                let e = const_dim_expr(d);
                let head = format!("invalid `{site}` in `");
                let tail = format!(
                    "`: the window does not fit, its output size `{d}` must be at least 1, but here it is "
                );
                let (v_id, m_id) = (
                    syn::Ident::new("v", Span::mixed_site()),
                    syn::Ident::new("m", Span::mixed_site()),
                );
                quote_spanned! {first=>
                    let #v_id: i128 = #e;
                    if #v_id < 1 {
                        let #m_id = ::rtx_core::shapes::ConstMessage::new().text(#head) #instance .text(#tail).int(#v_id);
                        ::core::panic!("{}", #m_id.as_str());
                    }
                }
            }
        };
        out.extend(quote!({ #check }));
    }
    out
}

/// A dimension over generic parameters as a constant `i128` expression (negative values stay
/// negative, so a window that does not fit shows by how much).
fn const_dim_expr(d: &Dim) -> TokenStream {
    let terms = d.terms().map(|(atoms, coeff)| {
        let factors = atoms.iter().map(|a| match a {
            Atom::Param(n) | Atom::Sym(n) => {
                let id = format_ident!("{}", n);
                quote!((#id as i128))
            }
            Atom::FloorDiv(inner, k) => {
                let inner = const_dim_expr(inner);
                let k = i128::from(*k);
                quote!((#inner).div_euclid(#k))
            }
        });
        let coeff = i128::from(coeff);
        quote!((#coeff #(* #factors)*))
    });
    quote!((0i128 #(+ #terms)*))
}
