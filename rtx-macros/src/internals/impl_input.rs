//! The input of `__model_impl!` (`lib.rs`): the struct, the impl and the nested models'
//! definitions in `@struct { .. } @impl { .. } @nested { .. }` sections, as the callbacks of
//! `#[model]` deliver them; and the `graph!` block found in an impl.

use super::ast::GraphDef;
use super::ctxt::Ctxt;
use super::lower::NestedModel;
use proc_macro2::{Span, TokenStream};
use std::collections::HashMap;
use syn::parse::{Parse, ParseStream};

/// The input of `__model_impl!`: the struct (absent when the struct's own expansion failed),
/// the impl, and the definitions of nested models gathered so far by callbacks.
pub struct ImplInput {
    pub item_struct: Option<syn::ItemStruct>,
    pub item_impl: syn::ItemImpl,
    pub nested: Vec<NestedTokens>,
}

/// A nested model as delivered by its `__rtx_graph_*` callback: its definition, or only its
/// name when its own expansion failed (`@broken { Name }`).
#[derive(Clone)]
pub struct NestedTokens {
    pub name: String,
    pub def: Option<(syn::ItemStruct, syn::ItemImpl)>,
    pub nested: Vec<NestedTokens>,
    pub raw: TokenStream,
}

struct Sections {
    item_struct: Option<syn::ItemStruct>,
    item_impl: Option<syn::ItemImpl>,
    broken: Option<syn::Ident>,
    nested: Vec<NestedTokens>,
}

fn parse_sections(input: ParseStream) -> syn::Result<Sections> {
    let mut out = Sections {
        item_struct: None,
        item_impl: None,
        broken: None,
        nested: Vec::new(),
    };
    while !input.is_empty() {
        input.parse::<syn::Token![@]>()?;
        let tag: syn::Ident = syn::ext::IdentExt::parse_any(input)?;
        let content;
        syn::braced!(content in input);
        match tag.to_string().as_str() {
            "struct" => out.item_struct = Some(content.parse()?),
            "impl" => out.item_impl = Some(content.parse()?),
            "broken" => out.broken = Some(content.parse()?),
            "nested" => {
                let raw: TokenStream = content.fork().parse()?;
                let inner = parse_sections(&content)?;
                let nested = match (inner.broken, inner.item_struct, inner.item_impl) {
                    (Some(name), ..) => NestedTokens {
                        name: name.to_string(),
                        def: None,
                        nested: inner.nested,
                        raw,
                    },
                    (None, Some(s), Some(i)) => NestedTokens {
                        name: s.ident.to_string(),
                        def: Some((s, i)),
                        nested: inner.nested,
                        raw,
                    },
                    _ => {
                        return Err(syn::Error::new(
                            tag.span(),
                            "internal: nested model without struct or impl",
                        ));
                    }
                };
                out.nested.push(nested);
            }
            _ => return Err(syn::Error::new(tag.span(), "internal: unknown section")),
        }
    }
    Ok(out)
}

impl Parse for ImplInput {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let sections = parse_sections(input)?;
        match (sections.item_struct, sections.broken, sections.item_impl) {
            (Some(s), None, Some(item_impl)) => Ok(ImplInput {
                item_struct: Some(s),
                item_impl,
                nested: sections.nested,
            }),
            (None, Some(_), Some(item_impl)) => Ok(ImplInput {
                item_struct: None,
                item_impl,
                nested: sections.nested,
            }),
            _ => Err(syn::Error::new(
                Span::call_site(),
                "internal: __model_impl! needs @struct (or @broken) and @impl",
            )),
        }
    }
}

/// Finds `graph! { .. }` in the impl and parses it; the other items pass through.
pub(crate) fn take_graph(
    item: &syn::ItemImpl,
    cx: &Ctxt,
) -> (Option<GraphDef>, Vec<syn::ImplItem>) {
    let mut graph = None;
    let mut rest = Vec::new();
    for it in &item.items {
        match it {
            syn::ImplItem::Macro(m) if m.mac.path.is_ident("graph") => {
                match syn::parse2::<GraphDef>(crate::internals::ast::where_as_raw_ident(
                    m.mac.tokens.clone(),
                )) {
                    Ok(g) if graph.is_none() => {
                        for f in &g.fns {
                            if let Some(e) = &f.body_error {
                                cx.syn_error(e.clone());
                            }
                        }
                        graph = Some(g)
                    }
                    Ok(_) => cx.error_spanned_by(&m.mac, "only one graph! block per #[model] impl"),
                    Err(e) => cx.syn_error(e),
                }
            }
            other => rest.push(other.clone()),
        }
    }
    (graph, rest)
}

/// Every nested model of `list` (recursively) by name, `None` for one whose expansion
/// failed, and their raw tokens in `raw`.
pub(crate) fn collect_nested(
    list: &[NestedTokens],
    out: &mut HashMap<String, Option<NestedModel>>,
    raw: &mut Vec<TokenStream>,
) {
    for n in list {
        let def = n.def.as_ref().and_then(|(item_struct, item_impl)| {
            let cx = Ctxt::new();
            let graph = take_graph(item_impl, &cx).0;
            // Its errors were reported by its own expansion.
            let _ = cx.check();
            graph.map(|graph| NestedModel {
                item: item_struct.clone(),
                graph,
            })
        });
        out.insert(n.name.clone(), def);
        raw.push(n.raw.clone());
        collect_nested(&n.nested, out, raw);
    }
}
