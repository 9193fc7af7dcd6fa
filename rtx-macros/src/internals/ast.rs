//! The parsed model: the struct's fields as layers, and the graph functions of `graph!`.
//!
// One file on purpose: it is serde_derive's `ast.rs`, the parsed form of the two items a
// model is made of (field kinds with their dimension expressions, graph signatures), and the
// parsing of both shares the dimension readers (`dim_from_expr`); the layer-typo heuristic
// and the `where` rewrite are its two helpers. Lowering and checks live in `lower.rs`.

use super::ctxt::Ctxt;
use proc_macro2::TokenStream;
use quote::ToTokens;
use rtx_ir::Dim;
use std::collections::HashMap;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Token, bracketed, parenthesized};

/// What a field of a `#[model]` struct is.
#[derive(Clone, Debug)]
pub enum FieldKind {
    Linear {
        inp: Dim,
        out: Dim,
    },
    Conv2d {
        c_in: Dim,
        c_out: Dim,
        k: Dim,
        stride: usize,
        pad: usize,
    },
    Embedding {
        vocab: Dim,
        dim: Dim,
    },
    LayerNorm {
        dim: Dim,
    },
    /// A free parameter of the given shape (`Param2<8, 64>`).
    Param {
        shape: Vec<Dim>,
    },
    /// Another `#[model]` struct; its generic arguments as dimensions.
    Nested {
        type_name: String,
        path: syn::Path,
        args: Vec<Dim>,
    },
    /// `[Block; 4]`: identical blocks named `blocks.0`, `blocks.1`, .. (PyTorch's
    /// `nn.ModuleList`), applied by index or in a `for` loop.
    Repeated {
        count: usize,
        item: Box<FieldKind>,
    },
}

impl FieldKind {
    /// The nested model this field holds, directly or as repeated blocks.
    pub fn nested_path(&self) -> Option<(&String, &syn::Path)> {
        match self {
            FieldKind::Nested {
                type_name, path, ..
            } => Some((type_name, path)),
            FieldKind::Repeated { item, .. } => item.nested_path(),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Field {
    pub name: syn::Ident,
    pub ty: syn::Type,
    pub kind: FieldKind,
}

/// A `#[model]` struct as the macros see it.
#[derive(Clone)]
pub struct ModelStruct {
    pub name: syn::Ident,
    pub const_params: Vec<syn::Ident>,
    pub fields: Vec<Field>,
}

/// Integer literal or const parameter of `params` as a dimension; `env` substitutes the
/// parameters of a nested model by the outer model's arguments.
pub fn dim_from_generic_arg(
    arg: &syn::GenericArgument,
    params: &[syn::Ident],
    env: &HashMap<String, Dim>,
) -> Option<Dim> {
    match arg {
        syn::GenericArgument::Const(e) => dim_from_expr(e, &[], params, env).ok(),
        syn::GenericArgument::Type(syn::Type::Path(p)) if p.qself.is_none() => {
            let id = p.path.get_ident()?;
            let name = id.to_string();
            if let Some(d) = env.get(&name) {
                return Some(d.clone());
            }
            params.iter().any(|q| *q == name).then(|| Dim::param(&name))
        }
        _ => None,
    }
}

/// A dimension written in source: `64`, `B`, `IN`, `C * H * W`, `(N + 1)`.
pub fn dim_from_expr(
    e: &syn::Expr,
    symbols: &[syn::Ident],
    params: &[syn::Ident],
    env: &HashMap<String, Dim>,
) -> syn::Result<Dim> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => Ok(Dim::known(i.base10_parse::<usize>()?)),
        syn::Expr::Path(p) if p.path.get_ident().is_some() => {
            let id = p
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            if let Some(d) = env.get(&id) {
                return Ok(d.clone());
            }
            if symbols.iter().any(|s| *s == id) {
                return Ok(Dim::sym(&id));
            }
            if params.iter().any(|s| *s == id) {
                return Ok(Dim::param(&id));
            }
            let mut decl: Vec<String> = symbols.iter().map(|s| s.to_string()).collect();
            decl.push(id.clone());
            Err(syn::Error::new_spanned(
                e,
                format!(
                    "unknown dimension `{id}`\n\n= help: declare it as a symbolic dimension of the graph function, `fn name<{}>(..)`, or as a const generic of the model",
                    decl.join(", ")
                ),
            ))
        }
        syn::Expr::Paren(p) => dim_from_expr(&p.expr, symbols, params, env),
        syn::Expr::Group(g) => dim_from_expr(&g.expr, symbols, params, env),
        syn::Expr::Block(b) if b.block.stmts.len() == 1 => match &b.block.stmts[0] {
            syn::Stmt::Expr(inner, None) => dim_from_expr(inner, symbols, params, env),
            _ => Err(syn::Error::new_spanned(
                e,
                "expected a dimension expression",
            )),
        },
        syn::Expr::Binary(b) => {
            let l = dim_from_expr(&b.left, symbols, params, env)?;
            let r = dim_from_expr(&b.right, symbols, params, env)?;
            match b.op {
                syn::BinOp::Add(_) => Ok(l.add(&r)),
                syn::BinOp::Sub(_) => Ok(l.sub(&r)),
                syn::BinOp::Mul(_) => Ok(l.mul(&r)),
                syn::BinOp::Div(_) => match r.as_known() {
                    Some(d) if d > 0 => Ok(l.floor_div(d as u64)),
                    _ => Err(syn::Error::new_spanned(
                        &b.right,
                        "a dimension can only be divided by a positive literal",
                    )),
                },
                _ => Err(syn::Error::new_spanned(
                    b.op,
                    "dimensions support only `+`, `-`, `*` and `/`",
                )),
            }
        }
        _ => Err(syn::Error::new_spanned(
            e,
            "expected a dimension: an integer, a symbolic dimension or a const generic",
        )),
    }
}

/// A type as the user wrote it: `Vec<f32>`, not the token printer's `Vec < f32 >`.
fn type_text(ty: &syn::Type) -> String {
    ty.to_token_stream()
        .to_string()
        .replace(" < ", "<")
        .replace(" <", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace(" :: ", "::")
}

/// The layer `name` is a typo of: the same letters but for one swapped pair, one letter
/// changed, added or dropped inside the word (first and last letters kept, so `QLinear`,
/// `Params` or `ConvBn` stay names of nested models), or another capitalization (`Conv2D`).
fn layer_typo(name: &str) -> Option<&'static str> {
    let n: Vec<char> = name.chars().collect();
    LAYERS.iter().copied().find(|layer| {
        let l: Vec<char> = layer.chars().collect();
        if name.eq_ignore_ascii_case(layer) {
            return name != *layer;
        }
        if n.first() != l.first() || n.last() != l.last() {
            return false;
        }
        let is_digit_change = |a: char, b: char| a.is_ascii_digit() || b.is_ascii_digit();
        match n.len() as isize - l.len() as isize {
            0 => {
                let diff: Vec<usize> = (0..n.len()).filter(|&i| n[i] != l[i]).collect();
                match diff.as_slice() {
                    [i] => !is_digit_change(n[*i], l[*i]),
                    [i, j] => *j == i + 1 && n[*i] == l[*j] && n[*j] == l[*i],
                    _ => false,
                }
            }
            1 => (0..n.len()).any(|i| {
                let mut m = n.clone();
                m.remove(i);
                m == l
            }),
            -1 => (0..l.len()).any(|i| {
                let mut m = l.clone();
                m.remove(i);
                m == n
            }),
            _ => false,
        }
    })
}

/// The layer types a field can have.
const LAYERS: &[&str] = &[
    "Linear",
    "Conv2d",
    "Embedding",
    "LayerNorm",
    "Param1",
    "Param2",
    "Param3",
    "Param4",
];

fn layer_kind(
    ty: &syn::Type,
    params: &[syn::Ident],
    env: &HashMap<String, Dim>,
    cx: &Ctxt,
) -> Option<FieldKind> {
    if let syn::Type::Array(array) = ty {
        let count = match dim_from_expr(&array.len, &[], params, env) {
            Ok(d) => d.as_known(),
            Err(_) => None,
        };
        let Some(count) = count else {
            cx.error_spanned_by(&array.len, "the number of repeated blocks must be an integer literal (or a const generic the model is instantiated with as a literal)");
            return None;
        };
        if count == 0 {
            cx.error_spanned_by(&array.len, "repeated blocks need at least one block");
            return None;
        }
        if matches!(&*array.elem, syn::Type::Array(_)) {
            cx.error_spanned_by(ty, "repeated blocks hold layers or #[model] structs, not arrays: nest a model that holds the inner array");
            return None;
        }
        let item = layer_kind(&array.elem, params, env, cx)?;
        return Some(FieldKind::Repeated {
            count,
            item: Box::new(item),
        });
    }
    let syn::Type::Path(tp) = ty else {
        cx.error_spanned_by(ty, "a model field must be a layer (Linear, Conv2d, Embedding, LayerNorm, Param1..Param4) , another #[model] struct, or an array of them (`[Block; 4]`)");
        return None;
    };
    let last = tp.path.segments.last()?;
    // Plain Rust types are never models; without this they would be taken for a nested
    // model and fail later as "cannot find macro `__rtx_graph_f32`".
    const NOT_LAYERS: &[&str] = &[
        "f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16",
        "u32", "u64", "u128", "usize", "bool", "char", "str", "String", "Vec", "Option", "Box",
        "Rc", "Arc", "HashMap", "Tensor",
    ];
    let ty_name = last.ident.to_string();
    if tp.qself.is_none() && NOT_LAYERS.contains(&ty_name.as_str()) {
        cx.error_spanned_by(
            ty,
            format!(
                "`{}` is not a layer: every field of a #[model] struct is a layer, a parameter or another #[model] struct\n\n= help: use Linear, Conv2d, Embedding, LayerNorm or Param1..Param4 (a learned scalar is `Param1<1>`); keep other state outside the model",
                type_text(ty)
            ),
        );
        return None;
    }
    let args: Vec<syn::GenericArgument> = match &last.arguments {
        syn::PathArguments::AngleBracketed(a) => a.args.iter().cloned().collect(),
        syn::PathArguments::None => Vec::new(),
        syn::PathArguments::Parenthesized(_) => {
            cx.error_spanned_by(ty, "unexpected parenthesized arguments in a field type");
            return None;
        }
    };
    let mut dims = Vec::new();
    for a in &args {
        match dim_from_generic_arg(a, params, env) {
            Some(d) => dims.push(d),
            None => {
                cx.error_spanned_by(a, "expected a dimension here: an integer literal or a const generic parameter of the model");
                return None;
            }
        }
    }
    let name = last.ident.to_string();
    let arity = |lo: usize, hi: usize, form: &str| -> bool {
        if dims.len() < lo || dims.len() > hi {
            cx.error_spanned_by(
                ty,
                format!("`{name}` takes {form}, found {} argument(s)", dims.len()),
            );
            false
        } else {
            true
        }
    };
    let known = |d: &Dim, what: &str| -> Option<usize> {
        let v = d.as_known();
        if v.is_none() {
            cx.error_spanned_by(
                ty,
                format!("the {what} of `{name}` must be an integer literal"),
            );
        }
        v
    };
    Some(match name.as_str() {
        "Linear" if arity(2, 2, "<IN, OUT>") => FieldKind::Linear {
            inp: dims[0].clone(),
            out: dims[1].clone(),
        },
        "Conv2d" if arity(3, 5, "<C_IN, C_OUT, K[, STRIDE[, PAD]]>") => FieldKind::Conv2d {
            c_in: dims[0].clone(),
            c_out: dims[1].clone(),
            k: dims[2].clone(),
            stride: dims.get(3).map(|d| known(d, "stride")).unwrap_or(Some(1))?,
            pad: dims
                .get(4)
                .map(|d| known(d, "padding"))
                .unwrap_or(Some(0))?,
        },
        "Embedding" if arity(2, 2, "<VOCAB, DIM>") => FieldKind::Embedding {
            vocab: dims[0].clone(),
            dim: dims[1].clone(),
        },
        "LayerNorm" if arity(1, 1, "<DIM>") => FieldKind::LayerNorm {
            dim: dims[0].clone(),
        },
        "Param1" if arity(1, 1, "<A>") => FieldKind::Param { shape: dims },
        "Param2" if arity(2, 2, "<A, B>") => FieldKind::Param { shape: dims },
        "Param3" if arity(3, 3, "<A, B, C>") => FieldKind::Param { shape: dims },
        "Param4" if arity(4, 4, "<A, B, C, D>") => FieldKind::Param { shape: dims },
        "Linear" | "Conv2d" | "Embedding" | "LayerNorm" | "Param1" | "Param2" | "Param3"
        | "Param4" => return None,
        // Any other type is taken for a nested model, so a misspelled layer would surface as
        // a missing model; a name one or two edits from a layer's is that typo.
        _ if tp.path.segments.len() == 1
            && let Some(layer) = layer_typo(&name) =>
        {
            cx.error_spanned_by(
                &last.ident,
                format!("unknown layer `{name}`\n\n= help: did you mean `{layer}`? the layers are {}; a nested model's struct is marked #[model]", LAYERS.join(", ")),
            );
            return None;
        }
        _ => FieldKind::Nested {
            type_name: name,
            path: tp.path.clone(),
            args: dims,
        },
    })
}

impl ModelStruct {
    /// Reads a struct; `env` maps its const params to the outer model's dims when nested.
    pub fn from_item(item: &syn::ItemStruct, env: &HashMap<String, Dim>, cx: &Ctxt) -> ModelStruct {
        let mut const_params = Vec::new();
        for p in &item.generics.params {
            match p {
                syn::GenericParam::Const(c) => const_params.push(c.ident.clone()),
                other => cx.error_spanned_by(
                    other,
                    "#[model] structs take only const generic parameters (`const IN: usize`)",
                ),
            }
        }
        let mut fields = Vec::new();
        match &item.fields {
            syn::Fields::Named(named) => {
                for f in &named.named {
                    let Some(name) = f.ident.clone() else {
                        continue;
                    };
                    if let Some(kind) = layer_kind(&f.ty, &const_params, env, cx) {
                        fields.push(Field {
                            name,
                            ty: f.ty.clone(),
                            kind,
                        });
                    }
                }
            }
            _ => cx.error_spanned_by(&item.ident, "#[model] needs a struct with named fields"),
        }
        ModelStruct {
            name: item.ident.clone(),
            const_params,
            fields,
        }
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    F32,
    I64,
}

/// `x: [B, 64]` or `y: i64[B]`.
#[derive(Clone)]
pub struct InputDef {
    /// `#[grad] x: [B, 64]`: `<fn>_and_grads` also returns the gradient of this input.
    pub grad: bool,
    pub name: syn::Ident,
    pub dtype: ElemType,
    pub dims: Vec<syn::Expr>,
}

/// One `fn` inside `graph!`.
#[derive(Clone)]
pub struct GraphFnDef {
    pub name: syn::Ident,
    pub symbols: Vec<syn::Ident>,
    pub inputs: Vec<InputDef>,
    pub output: Vec<syn::Expr>,
    pub body: syn::Block,
    /// Why the body did not parse (the body is then empty): the signature still gives the
    /// model its methods, so the program calling them reports nothing more.
    pub body_error: Option<syn::Error>,
    /// The function's doc comment (`/// ..` above it), put on the generated methods.
    pub docs: Vec<syn::Attribute>,
}

#[derive(Clone)]
pub struct GraphDef {
    pub fns: Vec<GraphFnDef>,
}

fn parse_dims(input: ParseStream) -> syn::Result<(Vec<syn::Expr>, TokenStream)> {
    let content;
    let br = bracketed!(content in input);
    let dims: Punctuated<syn::Expr, Token![,]> =
        content.parse_terminated(syn::Expr::parse, Token![,])?;
    let mut toks = TokenStream::new();
    br.surround(&mut toks, |t| dims.to_tokens(t));
    Ok((dims.into_iter().collect(), toks))
}

impl Parse for GraphFnDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut docs = Vec::new();
        for attr in input.call(syn::Attribute::parse_outer)? {
            if !attr.path().is_ident("doc") {
                return Err(syn::Error::new_spanned(
                    attr,
                    "unknown attribute on a graph function: only doc comments (`/// ..`) are allowed here",
                ));
            }
            docs.push(attr);
        }
        input.parse::<Token![fn]>()?;
        let name: syn::Ident = input.parse()?;
        let mut symbols = Vec::new();
        if input.peek(Token![<]) {
            input.parse::<Token![<]>()?;
            while !input.peek(Token![>]) {
                symbols.push(input.parse::<syn::Ident>()?);
                if !input.peek(Token![>]) {
                    input.parse::<Token![,]>()?;
                }
            }
            input.parse::<Token![>]>()?;
        }
        let content;
        parenthesized!(content in input);
        content.parse::<Token![&]>()?;
        content.parse::<Token![self]>()?;
        let mut inputs = Vec::new();
        while !content.is_empty() {
            content.parse::<Token![,]>()?;
            if content.is_empty() {
                break;
            }
            let mut grad = false;
            for attr in content.call(syn::Attribute::parse_outer)? {
                if attr.path().is_ident("grad") && matches!(attr.meta, syn::Meta::Path(_)) {
                    grad = true;
                } else {
                    return Err(syn::Error::new_spanned(
                        attr,
                        "unknown attribute on a graph input\n\n= help: the only one is `#[grad]`, which asks `<fn>_and_grads` for this input's gradient",
                    ));
                }
            }
            let name: syn::Ident = content.parse()?;
            content.parse::<Token![:]>()?;
            let dtype = if content.peek(syn::Ident) {
                let t: syn::Ident = content.parse()?;
                match t.to_string().as_str() {
                    "i64" => ElemType::I64,
                    "f32" => ElemType::F32,
                    _ => {
                        return Err(syn::Error::new(
                            t.span(),
                            "expected `f32` or `i64` before the shape, e.g. `y: i64[B]`",
                        ));
                    }
                }
            } else {
                ElemType::F32
            };
            let (dims, toks) = parse_dims(&content)?;
            let _ = toks;
            inputs.push(InputDef {
                grad,
                name,
                dtype,
                dims,
            });
        }
        input.parse::<Token![->]>()?;
        let (output, _) = parse_dims(input)?;
        let group: proc_macro2::Group = input.parse()?;
        if group.delimiter() != proc_macro2::Delimiter::Brace {
            return Err(syn::Error::new(
                group.span(),
                "expected the function's body in `{ .. }`",
            ));
        }
        let (body, body_error) = match syn::parse2::<syn::Block>(group.to_token_stream()) {
            Ok(body) => (body, None),
            Err(e) => (
                syn::Block {
                    brace_token: syn::token::Brace(group.delim_span()),
                    stmts: Vec::new(),
                },
                Some(e),
            ),
        };
        Ok(GraphFnDef {
            name,
            symbols,
            inputs,
            output,
            body,
            body_error,
            docs,
        })
    }
}

impl Parse for GraphDef {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut fns = Vec::new();
        while !input.is_empty() {
            fns.push(input.parse()?);
        }
        Ok(GraphDef { fns })
    }
}

/// `where` is a Rust keyword, so `where(cond, a, b)` (PyTorch's name) does not parse as a
/// call. Inside `graph!` it is rewritten to the raw identifier `r#where`, which does; the
/// lowering strips the `r#`.
pub fn where_as_raw_ident(tokens: TokenStream) -> TokenStream {
    use proc_macro2::{Group, TokenTree};
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Ident(i) if i == "where" => {
                TokenTree::Ident(proc_macro2::Ident::new_raw("where", i.span()))
            }
            TokenTree::Group(g) => {
                let mut inner = Group::new(g.delimiter(), where_as_raw_ident(g.stream()));
                inner.set_span(g.span());
                TokenTree::Group(inner)
            }
            other => other,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::layer_typo;

    #[test]
    fn misspelled_layers_are_typos() {
        for (name, layer) in [
            ("Linaer", "Linear"),
            ("Lnear", "Linear"),
            ("Linnear", "Linear"),
            ("Conv2D", "Conv2d"),
            ("Embeding", "Embedding"),
            ("LayerNrom", "LayerNorm"),
        ] {
            assert_eq!(layer_typo(name), Some(layer), "{name}");
        }
    }

    #[test]
    fn model_names_near_a_layer_are_not_typos() {
        for name in [
            "Linear", "QLinear", "MyLinear", "Conv", "ConvBn", "Conv1d", "Params", "Param5",
            "Encoder", "Lin",
        ] {
            assert_eq!(layer_typo(name), None, "{name}");
        }
    }
}
