//! Reading the user's tokens for the lowering: literals, names, patterns, the op-name
//! suggestions of "unknown op" errors and the wording of a failed shape rule. Free functions
//! with no lowering state, split from `lower.rs`.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use rtx_ir::{Dim, ShapeError, ShapeErrorKind};

/// Every op name `graph!` knows, for "unknown op" diagnostics.
pub(super) fn known_ops() -> Vec<&'static str> {
    rtx_ir::library::LIBRARY.iter().map(|op| op.name).collect()
}

pub(super) fn ops_help() -> String {
    format!(
        "available ops: {}; layers are called as `self.field(x)`",
        known_ops().join(", ")
    )
}

/// The closest op name within edit distance 2.
pub(super) fn suggest(name: &str) -> Option<&'static str> {
    closest(name, &known_ops())
}

/// The closest of `candidates` to `name` within edit distance 2 (the first on ties).
pub(crate) fn closest<'c>(name: &str, candidates: &[&'c str]) -> Option<&'c str> {
    fn dist(a: &str, b: &str) -> usize {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut cur = vec![i; b.len() + 1];
            for j in 1..=b.len() {
                cur[j] = (prev[j] + 1)
                    .min(cur[j - 1] + 1)
                    .min(prev[j - 1] + usize::from(a[i - 1] != b[j - 1]));
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .iter()
        .map(|o| (dist(name, o), *o))
        .filter(|(d, _)| *d <= 2 && *d < name.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, o)| o)
}

/// "shape mismatch in `self.fc2(..)`: expected [B, 127], found [B, 128]" plus a help line.
pub fn message(callsite: &str, e: &ShapeError) -> String {
    let head = match &e.kind {
        ShapeErrorKind::Mismatch { .. } | ShapeErrorKind::Broadcast { .. } => {
            format!("shape mismatch in `{callsite}`: {}", e.detail())
        }
        ShapeErrorKind::Invalid(m) => format!("invalid `{callsite}`: {m}"),
    };
    let generic = match &e.kind {
        ShapeErrorKind::Mismatch {
            expected,
            found,
            axis: Some(i),
        } => [expected.get(*i), found.get(*i)],
        ShapeErrorKind::Broadcast { dim_a, dim_b, .. } => [Some(dim_a), Some(dim_b)],
        _ => [None, None],
    }
    .into_iter()
    .flatten()
    .find(|d| matches!(d.as_single_atom(), Some(rtx_ir::Atom::Param(_))));
    let note = generic.map(|d| format!("\n= note: `{d}` is a generic parameter of the model: it equals only itself, since the model must be right for every value of it; use one parameter (or one literal) for dimensions that must be equal"));
    match (&e.help, note) {
        (Some(h), Some(n)) => format!("{head}\n\n= help: {h}{n}"),
        (Some(h), None) => format!("{head}\n\n= help: {h}"),
        (None, Some(n)) => format!("{head}\n{n}"),
        (None, None) => head,
    }
}

pub(super) fn is_self(e: &syn::Expr) -> bool {
    matches!(e, syn::Expr::Path(p) if p.path.is_ident("self"))
}

pub(super) fn member_name(m: &syn::Member) -> String {
    match m {
        syn::Member::Named(i) => i.to_string(),
        syn::Member::Unnamed(i) => i.index.to_string(),
    }
}

pub(super) fn literal(e: &syn::Expr) -> Option<f64> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Float(f),
            ..
        }) => f.base10_parse().ok(),
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().ok(),
        syn::Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => literal(&u.expr).map(|v| -v),
        syn::Expr::Paren(p) => literal(&p.expr),
        _ => None,
    }
}

pub(super) fn int_literal(e: &syn::Expr) -> Option<i64> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().ok(),
        syn::Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => {
            int_literal(&u.expr).map(|v| -v)
        }
        syn::Expr::Paren(p) => int_literal(&p.expr),
        _ => None,
    }
}

/// The names a `let` pattern binds (`h` in `h: T`, `a` and `b` in `(a, b)`).
pub(super) fn pattern_names(p: &syn::Pat, out: &mut Vec<String>) {
    match p {
        syn::Pat::Ident(i) => out.push(i.ident.to_string()),
        syn::Pat::Type(t) => pattern_names(&t.pat, out),
        syn::Pat::Tuple(t) => t.elems.iter().for_each(|e| pattern_names(e, out)),
        syn::Pat::Slice(s) => s.elems.iter().for_each(|e| pattern_names(e, out)),
        syn::Pat::Paren(p) => pattern_names(&p.pat, out),
        syn::Pat::Reference(r) => pattern_names(&r.pat, out),
        syn::Pat::TupleStruct(t) => t.elems.iter().for_each(|e| pattern_names(e, out)),
        _ => {}
    }
}

/// One atom as a dimension of its own.
pub(super) fn atom_dim(a: &rtx_ir::Atom) -> Dim {
    match a {
        rtx_ir::Atom::Sym(n) => Dim::sym(n),
        rtx_ir::Atom::Param(n) => Dim::param(n),
        rtx_ir::Atom::FloorDiv(inner, d) => inner.floor_div(*d),
    }
}

/// The identifiers of a dimension expression (`D` and `H` in `D * H / 2`).
pub(super) fn dim_names(e: &syn::Expr, out: &mut Vec<String>) {
    match e {
        syn::Expr::Path(p) => {
            if let Some(id) = p.path.get_ident() {
                out.push(id.to_string());
            }
        }
        syn::Expr::Binary(b) => {
            dim_names(&b.left, out);
            dim_names(&b.right, out);
        }
        syn::Expr::Paren(p) => dim_names(&p.expr, out),
        syn::Expr::Group(g) => dim_names(&g.expr, out),
        syn::Expr::Block(b) => {
            if let Some(syn::Stmt::Expr(inner, None)) = b.block.stmts.first() {
                dim_names(inner, out);
            }
        }
        _ => {}
    }
}

pub(super) fn block_tail(b: &syn::Block) -> TokenStream {
    match b.stmts.last() {
        Some(syn::Stmt::Expr(e, None)) => e.to_token_stream(),
        _ => quote!(#b),
    }
}
