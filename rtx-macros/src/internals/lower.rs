//! Lowers a graph function's body to the IR, running every op's shape rule as it goes.
//!
//! Each error names the op, the expected and found shapes, and spans the user's
//! sub-expression; lowering continues after an error so one expansion reports them all.
//! Calls to other graph functions and to nested `#[model]` fields are inlined, so the whole
//! model is one graph to differentiate.

// One file, with a reason: everything here is one `impl Lowerer` walking the user's syntax
// tree with one `Scope` (names, poisoned bindings, symbols, the nested model being inlined),
// and its error recovery (a failed expression returns `None`, silently to everything that
// reads it) only holds if every path follows it in the same place. What needs no lowering
// state lives beside it: `syntax.rs` (literals, names, suggestions, message wording) and
// `library_call.rs` (calls of library ops). Layer calls and argument parsing are the next to
// move, as the library table learns axis and shape arguments.

use super::ast::{ElemType, FieldKind, GraphDef, GraphFnDef, ModelStruct, dim_from_expr};
use super::ctxt::Ctxt;
use proc_macro2::TokenStream;
use quote::ToTokens;
use rtx_ir::library::{Arg, Args, LibraryOp, Param};
use rtx_ir::{
    Cmp, DType, Dim, Graph, NodeId, Op, Shape, ShapeError, ShapeErrorKind, Unifier, fmt_shape,
};
use std::collections::HashMap;

use super::syntax::{
    atom_dim, block_tail, dim_names, int_literal, is_self, literal, member_name, ops_help,
    pattern_names, suggest,
};
pub(crate) use super::syntax::{closest, message};

/// A nested model's definition, delivered by its callback macro. A model whose own expansion
/// failed arrives as `None` in the map of nested models: it has reported its errors, and calls
/// of it are poisoned values here rather than new errors.
#[derive(Clone)]
pub struct NestedModel {
    pub item: syn::ItemStruct,
    pub graph: GraphDef,
}

/// A parameter the graph reads, and where it lives in the model struct.
#[derive(Clone, Debug)]
pub struct ParamRef {
    pub name: String,
    /// Rust field path from `self` to the tensor: `["fc1", "weight"]`.
    pub access: Vec<String>,
    pub node: NodeId,
}

/// A relation over generic dimensions checked when the model is instantiated, and the user's
/// expression it came from.
pub struct Obligation {
    pub relation: rtx_ir::Obligation,
    pub tokens: TokenStream,
    /// The op in the user's terms: `self.fc(..)`.
    pub site: String,
}

pub struct Lowerer<'a> {
    pub cx: &'a Ctxt,
    pub graph: Graph,
    pub u: Unifier,
    pub params: Vec<ParamRef>,
    pub obligations: Vec<Obligation>,
    pub nested: &'a HashMap<String, Option<NestedModel>>,
    /// Function names on the inlining stack, to reject recursion.
    stack: Vec<String>,
    /// A call of a nested model whose own expansion failed was poisoned: a function may then
    /// fail to lower without an error of its own.
    pub broken_nested: bool,
}

/// Where names resolve while lowering one function body.
pub(super) struct Scope<'s> {
    pub(super) model: &'s ModelStruct,
    pub(super) fns: &'s [GraphFnDef],
    /// Field path from the top model to this one (`["enc"]`).
    pub(super) prefix: Vec<String>,
    /// Symbolic dims and nested generic params, resolved to the caller's dims.
    pub(super) env: HashMap<String, Dim>,
    pub(super) symbols: Vec<syn::Ident>,
    /// Values by name; `None` is a poisoned binding (its right-hand side failed and was
    /// reported), so what reads it stays silent instead of cascading.
    pub(super) vars: HashMap<String, Option<NodeId>>,
    /// Loop variables bound to one of repeated blocks (`for block in &self.blocks`).
    pub(super) aliases: HashMap<String, Member>,
}

/// A layer or nested model the graph calls: a field, one of repeated blocks, or a loop
/// variable bound to one.
#[derive(Clone)]
pub(super) struct Member {
    /// Names below the current model: `["fc"]`, `["blocks", "0"]`.
    pub path: Vec<String>,
    /// As the user wrote it: `self.fc`, `self.blocks[0]`, `block`.
    pub shown: String,
    pub kind: FieldKind,
}

impl Member {
    fn field(name: &str, kind: FieldKind) -> Member {
        Member {
            path: vec![name.to_string()],
            shown: format!("self.{name}"),
            kind,
        }
    }
}

/// A call as written, for spans: the whole expression and its arguments.
pub(super) struct CallSyntax {
    pub whole: TokenStream,
    pub args: Vec<syn::Expr>,
}

impl CallSyntax {
    fn new(whole: &dyn ToTokens, args: impl IntoIterator<Item = syn::Expr>) -> CallSyntax {
        CallSyntax {
            whole: whole.to_token_stream(),
            args: args.into_iter().collect(),
        }
    }
}

fn join(prefix: &[String], name: &str) -> String {
    let mut v = prefix.to_vec();
    v.push(name.to_string());
    v.join(".")
}

impl<'a> Lowerer<'a> {
    pub fn new(cx: &'a Ctxt, nested: &'a HashMap<String, Option<NestedModel>>) -> Lowerer<'a> {
        Lowerer {
            cx,
            graph: Graph::default(),
            u: Unifier::default(),
            params: Vec::new(),
            obligations: Vec::new(),
            nested,
            stack: Vec::new(),
            broken_nested: false,
        }
    }

    fn shape(&self, n: NodeId) -> &Shape {
        &self.graph.node(n).shape
    }

    /// Pushes an op; on a shape error reports it at the argument at fault (or the whole call).
    fn push(
        &mut self,
        op: Op,
        args: &[NodeId],
        callsite: &str,
        whole: &dyn ToTokens,
        arg_tokens: &[&dyn ToTokens],
    ) -> Option<NodeId> {
        match self.push_checked(op, args, whole, callsite) {
            Ok(id) => Some(id),
            Err(mut e) => {
                if let Some(hint) = self.keepdim_hint(&e, args) {
                    e.help = Some(hint);
                }
                let at: &dyn ToTokens = arg_tokens.get(e.arg).copied().unwrap_or(whole);
                self.cx
                    .error_spanned_by(at.to_token_stream(), message(callsite, &e));
                None
            }
        }
    }

    /// When a broadcast fails because an operand is a reduction that dropped its axes, and
    /// keeping them as 1 would broadcast, the help says so (`x - mean(x, 1)` wants `keepdim`).
    fn keepdim_hint(&self, e: &ShapeError, args: &[NodeId]) -> Option<String> {
        if !matches!(e.kind, ShapeErrorKind::Broadcast { .. }) || args.len() != 2 {
            return None;
        }
        for (i, &arg) in args.iter().enumerate() {
            let node = self.graph.node(arg);
            let (name, axes) = match &node.op {
                Op::Sum {
                    axes,
                    keepdim: false,
                } => ("sum", axes),
                Op::Mean {
                    axes,
                    keepdim: false,
                } => ("mean", axes),
                Op::Max {
                    axes,
                    keepdim: false,
                } => ("max", axes),
                _ => continue,
            };
            let Some(&input) = node.args.first() else {
                continue;
            };
            let mut kept = self.shape(input).clone();
            for &a in axes {
                if let Some(d) = kept.get_mut(a) {
                    *d = Dim::known(1);
                }
            }
            let other = self.shape(args[1 - i]);
            if rtx_ir::broadcast(&kept, other, &mut Unifier::default()).is_err() {
                continue;
            }
            let list: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
            let axes_arg = if list.len() == 1 {
                list[0].clone()
            } else {
                format!("[{}]", list.join(", "))
            };
            return Some(format!(
                "`{name}(..)` removed axis {axes_arg}, so its result is {} where {} would broadcast; keep the axis as 1 with `keepdim`: `{name}(x, {axes_arg}, keepdim)`",
                fmt_shape(&node.shape),
                fmt_shape(&kept)
            ));
        }
        None
    }

    /// Pushes an op after its shape rule; relations over generic dimensions it needed become
    /// obligations, attributed to `whole`.
    // The error carries both shapes for the message; it is built only on failure.
    #[allow(clippy::result_large_err)]
    pub(super) fn push_checked(
        &mut self,
        op: Op,
        args: &[NodeId],
        whole: &dyn ToTokens,
        site: &str,
    ) -> Result<NodeId, ShapeError> {
        let before = self.u.obligations.len();
        let id = self.graph.push_shared(op, args, &mut self.u)?;
        self.defer_obligations(before, whole, site);
        Ok(id)
    }

    /// Moves the unifier's obligations from `before` on to the ones checked at instantiation,
    /// spanned at `whole`.
    pub(super) fn defer_obligations(&mut self, before: usize, whole: &dyn ToTokens, site: &str) {
        let new: Vec<rtx_ir::Obligation> = self.u.obligations.drain(before..).collect();
        for relation in new {
            self.obligations.push(Obligation {
                relation,
                tokens: whole.to_token_stream(),
                site: site.to_string(),
            });
        }
    }

    pub(super) fn konst(&mut self, v: f64) -> NodeId {
        // A scalar constant has no shape constraint to fail.
        self.graph
            .push_shared(Op::Const { value: v }, &[], &mut self.u)
            .unwrap_or(0)
    }

    pub(super) fn param(&mut self, name: String, access: Vec<String>, shape: Shape) -> NodeId {
        if let Some(p) = self.params.iter().find(|p| p.name == name) {
            return p.node;
        }
        let node = self
            .graph
            .push(
                Op::Param {
                    name: name.clone(),
                    shape,
                },
                &[],
                &mut self.u,
            )
            .unwrap_or(0);
        self.params.push(ParamRef { name, access, node });
        node
    }

    /// Lowers the top-level function `f` of `model`; returns (output node, inputs).
    pub fn lower_fn(
        &mut self,
        model: &ModelStruct,
        graph: &GraphDef,
        f: &GraphFnDef,
    ) -> Option<NodeId> {
        // Its parse error is reported with the graph.
        if f.body_error.is_some() {
            return None;
        }
        let mut sc = Scope {
            model,
            fns: &graph.fns,
            prefix: Vec::new(),
            env: HashMap::new(),
            symbols: f.symbols.clone(),
            vars: HashMap::new(),
            aliases: HashMap::new(),
        };
        let mut ok = true;
        // Every input dimension with the expression it was written as, to check below that
        // each symbol can be read from some input.
        let mut input_dims: Vec<(Dim, &syn::Expr)> = Vec::new();
        // A name the signature does not declare is one mistake however often it is used.
        let mut reported: Vec<String> = Vec::new();
        for (index, inp) in f.inputs.iter().enumerate() {
            let mut shape = Vec::new();
            for d in &inp.dims {
                match dim_from_expr(d, &f.symbols, &model.const_params, &sc.env) {
                    Ok(dim) => {
                        input_dims.push((dim.clone(), d));
                        shape.push(dim)
                    }
                    Err(e) => {
                        self.report_once(e, &mut reported);
                        ok = false;
                    }
                }
            }
            let dtype = if inp.dtype == ElemType::I64 {
                DType::I64
            } else {
                DType::F32
            };
            let node = self
                .graph
                .push(
                    Op::Input {
                        index,
                        name: inp.name.to_string(),
                        shape,
                        dtype,
                    },
                    &[],
                    &mut self.u,
                )
                .ok()?;
            sc.vars.insert(inp.name.to_string(), Some(node));
        }
        if ok {
            ok = self.symbols_are_bound(f, &input_dims);
        }
        let declared = self.declared_output(f, &sc, &mut reported);
        if !ok {
            return None;
        }
        self.stack.push(f.name.to_string());
        let out = self.lower_block(&mut sc, &f.body);
        self.stack.pop();
        let out = out?;
        let declared = declared?;
        let found = self.shape(out).clone();
        let tail = block_tail(&f.body);
        let result_site = format!("fn {}", f.name);
        // Compound relations over generic dims are checked at instantiation, like everywhere.
        let same = declared.len() == found.len()
            && declared
                .iter()
                .zip(&found)
                .all(|(d, g)| self.same_or_oblige(g, d, &tail, &result_site));
        if !same {
            let which = if declared.len() != found.len() {
                format!(" (rank {} vs {})", declared.len(), found.len())
            } else {
                match declared.iter().zip(&found).position(|(d, g)| d != g) {
                    Some(i) => format!(
                        " (dimension {i}: declared {}, computed {})",
                        declared[i], found[i]
                    ),
                    None => String::new(),
                }
            };
            self.cx.error_spanned_by(
                tail,
                format!(
                    "shape mismatch in the result of `{}`: the signature declares {}, the body computes {}{which}\n\n= help: change the declared output shape after `->`, or the last expression",
                    f.name,
                    fmt_shape(&declared),
                    fmt_shape(&found)
                ),
            );
            return None;
        }
        Some(out)
    }

    /// A symbolic dimension is bound on entry from an input axis that is that symbol alone;
    /// one that appears only inside a product or a sum (`x: [B * T, 16]`), or in no input,
    /// has no value to take, so it is refused here, at the user's line.
    fn symbols_are_bound(&self, f: &GraphFnDef, input_dims: &[(Dim, &syn::Expr)]) -> bool {
        let mut ok = true;
        for sym in &f.symbols {
            let name = sym.to_string();
            let alone = input_dims.iter().any(
                |(d, _)| matches!(d.as_single_atom(), Some(rtx_ir::Atom::Sym(s)) if *s == name),
            );
            if alone {
                continue;
            }
            ok = false;
            let inside = input_dims
                .iter()
                .find(|(d, _)| d.atoms().contains(&rtx_ir::Atom::Sym(name.clone())));
            match inside {
                Some((d, expr)) => self.cx.error_spanned_by(
                    expr,
                    format!("symbolic dimension `{name}` appears in the inputs only inside `{d}`, so its value cannot be read from an input's shape\n\n= help: give `{name}` an axis of its own in some input (e.g. `[{name}, ..]`), and reshape inside the graph"),
                ),
                None => self.cx.error_spanned_by(
                    sym,
                    format!("symbolic dimension `{name}` is not an axis of any input of `{}`, so it has no value when the function runs\n\n= help: use it in an input's shape, or remove it from `<..>`", f.name),
                ),
            }
        }
        ok
    }

    fn declared_output(
        &mut self,
        f: &GraphFnDef,
        sc: &Scope,
        reported: &mut Vec<String>,
    ) -> Option<Shape> {
        let mut shape = Vec::new();
        for d in &f.output {
            match dim_from_expr(d, &f.symbols, &sc.model.const_params, &sc.env) {
                Ok(d) => shape.push(d),
                Err(e) => {
                    self.report_once(e, reported);
                    return None;
                }
            }
        }
        Some(shape)
    }

    /// Reports `e` unless the same message was reported before (`reported`).
    fn report_once(&self, e: syn::Error, reported: &mut Vec<String>) {
        let text = e.to_string();
        if !reported.contains(&text) {
            reported.push(text);
            self.cx.syn_error(e);
        }
    }

    fn lower_block(&mut self, sc: &mut Scope, block: &syn::Block) -> Option<NodeId> {
        let mut last = None;
        let mut failed = false;
        for (i, stmt) in block.stmts.iter().enumerate() {
            match stmt {
                syn::Stmt::Local(local) => failed |= !self.lower_let(sc, local),
                syn::Stmt::Expr(syn::Expr::ForLoop(l), _) => failed |= !self.lower_for(sc, l),
                syn::Stmt::Expr(syn::Expr::Assign(a), _) => failed |= !self.lower_assign(sc, a),
                syn::Stmt::Expr(e, None) if i + 1 == block.stmts.len() => {
                    last = self.lower_expr(sc, e)
                }
                other => {
                    self.cx.error_spanned_by(
                        other,
                        "graph! bodies hold `let` bindings, assignments and `for` loops over repeated blocks, and end with the result expression",
                    );
                    failed = true;
                }
            }
        }
        let has_tail = matches!(
            block.stmts.last(),
            Some(syn::Stmt::Expr(e, None)) if !matches!(e, syn::Expr::ForLoop(_) | syn::Expr::Assign(_))
        );
        if !has_tail && !failed {
            self.cx.error_spanned_by(
                block,
                "a graph function must end with an expression (its result)",
            );
        }
        if failed { None } else { last }
    }

    /// `let name = expr;`; false when it failed (reported), leaving its names poisoned.
    pub(super) fn lower_let(&mut self, sc: &mut Scope, local: &syn::Local) -> bool {
        // A `let` that cannot bind poisons every name in its pattern, so the lines that read
        // them add nothing to its one error.
        let poison = |sc: &mut Scope| {
            let mut names = Vec::new();
            pattern_names(&local.pat, &mut names);
            for n in names {
                sc.vars.insert(n, None);
            }
        };
        let syn::Pat::Ident(pi) = &local.pat else {
            self.cx.error_spanned_by(
                &local.pat,
                "graph! supports only `let name = expr;` (no type annotation or pattern: shapes are inferred)",
            );
            poison(sc);
            return false;
        };
        let Some(init) = &local.init else {
            self.cx
                .error_spanned_by(local, "a `let` in graph! needs a value");
            poison(sc);
            return false;
        };
        // A failed right-hand side poisons the name, also hiding any binding it shadowed:
        // later lines that read it are neither "unknown" nor checked against the stale value.
        let value = self.lower_expr(sc, &init.expr);
        sc.vars.insert(pi.ident.to_string(), value);
        value.is_some()
    }

    pub(super) fn lower_expr(&mut self, sc: &mut Scope, e: &syn::Expr) -> Option<NodeId> {
        match e {
            syn::Expr::Paren(p) => self.lower_expr(sc, &p.expr),
            syn::Expr::Group(g) => self.lower_expr(sc, &g.expr),
            syn::Expr::Path(p) => {
                let name = p
                    .path
                    .get_ident()
                    .map(|i| i.to_string())
                    .unwrap_or_default();
                match sc.vars.get(&name) {
                    Some(&value) => value,
                    None if sc.aliases.contains_key(&name) => {
                        let member = sc.aliases.get(&name).cloned()?;
                        self.member_value(sc, &member, e)
                    }
                    None => {
                        let mut known: Vec<&str> = sc.vars.keys().map(String::as_str).collect();
                        known.sort();
                        let hint = closest(&name, &known)
                            .map(|k| format!("did you mean `{k}`? "))
                            .unwrap_or_default();
                        let known: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
                        self.cx.error_spanned_by(
                            e,
                            format!("unknown variable `{}` in graph!\n\n= help: {hint}the values in scope are {}", p.to_token_stream(), known.join(", ")),
                        );
                        None
                    }
                }
            }
            syn::Expr::Lit(l) => match &l.lit {
                syn::Lit::Float(f) => f.base10_parse::<f64>().ok().map(|v| self.konst(v)),
                syn::Lit::Int(i) => i.base10_parse::<f64>().ok().map(|v| self.konst(v)),
                _ => {
                    self.cx
                        .error_spanned_by(e, "only numeric constants are allowed in graph!");
                    None
                }
            },
            syn::Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => {
                if let Some(v) = literal(&u.expr) {
                    return Some(self.konst(-v));
                }
                let x = self.lower_expr(sc, &u.expr)?;
                self.push(Op::Neg, &[x], "-x", e, &[&u.expr])
            }
            syn::Expr::Binary(b) => {
                let (op, sym) = match b.op {
                    syn::BinOp::Add(_) => (Op::Add, "+"),
                    syn::BinOp::Sub(_) => (Op::Sub, "-"),
                    syn::BinOp::Mul(_) => (Op::Mul, "*"),
                    syn::BinOp::Div(_) => (Op::Div, "/"),
                    syn::BinOp::Gt(_) => (Op::Compare { cmp: Cmp::Gt }, ">"),
                    syn::BinOp::Ge(_) => (Op::Compare { cmp: Cmp::Ge }, ">="),
                    syn::BinOp::Lt(_) => (Op::Compare { cmp: Cmp::Lt }, "<"),
                    syn::BinOp::Le(_) => (Op::Compare { cmp: Cmp::Le }, "<="),
                    syn::BinOp::Eq(_) => (Op::Compare { cmp: Cmp::Eq }, "=="),
                    syn::BinOp::Ne(_) => (Op::Compare { cmp: Cmp::Ne }, "!="),
                    _ => {
                        self.cx.error_spanned_by(
                            b.op,
                            "graph! supports the operators `+`, `-`, `*`, `/` and the comparisons `>`, `>=`, `<`, `<=`, `==`, `!=` (1.0 where true, else 0.0)",
                        );
                        return None;
                    }
                };
                let l = self.lower_expr(sc, &b.left);
                let r = self.lower_expr(sc, &b.right);
                let (l, r) = (l?, r?);
                let callsite = format!("a {sym} b");
                self.push(op, &[l, r], &callsite, e, &[e, e])
            }
            syn::Expr::Field(f) if is_self(&f.base) => {
                let name = member_name(&f.member);
                match sc.model.field(&name).map(|fl| fl.kind.clone()) {
                    Some(FieldKind::Param { shape }) => {
                        let full = join(&sc.prefix, &name);
                        let mut access = sc.prefix.clone();
                        access.extend([name, "value".to_string()]);
                        Some(self.param(full, access, shape))
                    }
                    Some(FieldKind::Repeated { count, .. }) => {
                        self.cx.error_spanned_by(
                            e,
                            format!("`self.{name}` holds {count} blocks\n\n= help: apply them in turn with `for block in &self.{name} {{ x = block(x); }}`, or one of them with `self.{name}[0](x)`"),
                        );
                        None
                    }
                    Some(_) => {
                        self.cx.error_spanned_by(
                            e,
                            format!("`self.{name}` is a layer; call it: `self.{name}(x)`"),
                        );
                        None
                    }
                    None => {
                        self.unknown_field(sc, e, &name);
                        None
                    }
                }
            }
            syn::Expr::Index(_) => {
                let member = self.member_of(sc, e)??;
                self.member_value(sc, &member, e)
            }
            syn::Expr::MethodCall(m) => self.lower_method(sc, m, e),
            syn::Expr::Call(c) => self.lower_call(sc, c, e),
            _ => {
                self.cx.error_spanned_by(e, "unsupported expression in graph!: use op calls, layer calls, `+ - * /`, numbers and `let` bindings");
                None
            }
        }
    }

    pub(super) fn unknown_field(&self, sc: &Scope, e: &dyn ToTokens, name: &str) {
        let fields: Vec<String> = sc
            .model
            .fields
            .iter()
            .map(|f| format!("`{}`", f.name))
            .collect();
        self.cx.error_spanned_by(
            e.to_token_stream(),
            format!(
                "`{}` has no field or graph function `{name}`\n\n= help: its fields are {}",
                sc.model.name,
                if fields.is_empty() {
                    "none".to_string()
                } else {
                    fields.join(", ")
                }
            ),
        );
    }

    fn lower_method(
        &mut self,
        sc: &mut Scope,
        m: &syn::ExprMethodCall,
        e: &syn::Expr,
    ) -> Option<NodeId> {
        let method = m.method.to_string();
        let call = CallSyntax::new(m, m.args.iter().cloned());
        // self.field(x) or self.graph_fn(x..)
        if is_self(&m.receiver) {
            let args: Vec<Option<NodeId>> = m.args.iter().map(|a| self.lower_expr(sc, a)).collect();
            // A misspelled field is its own mistake, reported even when an argument failed.
            let known =
                sc.model.field(&method).is_some() || sc.fns.iter().any(|f| f.name == method);
            if !known {
                self.unknown_field(sc, &m.method, &method);
                return None;
            }
            let args: Vec<NodeId> = args.into_iter().collect::<Option<_>>()?;
            if let Some(field) = sc.model.field(&method).cloned() {
                let member = Member::field(&method, field.kind);
                return self.layer_call(sc, &member, &args, &call, e);
            }
            if let Some(f) = sc.fns.iter().find(|f| f.name == method) {
                let f = f.clone();
                let (model, fns, prefix, env) =
                    (sc.model, sc.fns, sc.prefix.clone(), sc.env.clone());
                return self.inline_call(
                    model,
                    fns,
                    prefix,
                    env,
                    &f,
                    &args,
                    &format!("self.{method}(..)"),
                    &call,
                    None,
                );
            }
            self.unknown_field(sc, &m.method, &method);
            return None;
        }
        // self.nested.graph_fn(x..)
        if let syn::Expr::Field(f) = &*m.receiver
            && is_self(&f.base)
        {
            let name = member_name(&f.member);
            let args: Vec<Option<NodeId>> = m.args.iter().map(|a| self.lower_expr(sc, a)).collect();
            let Some(field) = sc.model.field(&name).cloned() else {
                self.unknown_field(sc, &f.member, &name);
                return None;
            };
            let args: Vec<NodeId> = args.into_iter().collect::<Option<_>>()?;
            let member = Member::field(&name, field.kind);
            return self.nested_call(sc, &member, &method, Some(&m.method), &args, &call);
        }
        // self.blocks[0].graph_fn(x..), or block.graph_fn(x..) in a loop over them
        if let Some(member) = self.member_of(sc, &m.receiver) {
            let member = member?;
            let args: Vec<Option<NodeId>> = m.args.iter().map(|a| self.lower_expr(sc, a)).collect();
            let args: Vec<NodeId> = args.into_iter().collect::<Option<_>>()?;
            return self.nested_call(sc, &member, &method, Some(&m.method), &args, &call);
        }
        self.cx.error_spanned_by(e, format!("unknown method `.{method}()` in graph!: ops are written as functions, e.g. `{method}(x)`"));
        None
    }

    pub(super) fn layer_call(
        &mut self,
        sc: &mut Scope,
        member: &Member,
        args: &[NodeId],
        call: &CallSyntax,
        e: &syn::Expr,
    ) -> Option<NodeId> {
        let kind = &member.kind;
        let shown = &member.shown;
        let callsite = format!("{shown}(..)");
        let arg_tok: Vec<&dyn ToTokens> = call.args.iter().map(|a| a as &dyn ToTokens).collect();
        let want_args = |me: &Self, n: usize| {
            if args.len() != n {
                me.cx.error_spanned_by(
                    e,
                    format!("`{callsite}` takes {n} argument(s), found {}", args.len()),
                );
                return false;
            }
            true
        };
        let pname = |p: &str| join(&sc.prefix, &format!("{}.{p}", member.path.join(".")));
        let access = |p: &str| {
            let mut a = sc.prefix.clone();
            a.extend(member.path.iter().cloned());
            a.push(p.to_string());
            a
        };
        match kind {
            FieldKind::Linear { inp, out } => {
                if !want_args(self, 1) {
                    return None;
                }
                let x = args[0];
                let xs = self.shape(x).clone();
                if xs.len() < 2 {
                    self.cx.error_spanned_by(arg_tok[0].to_token_stream(), format!("shape mismatch in `{callsite}`: expected [N, {inp}] or a higher-rank input ending in {inp}, found {}", fmt_shape(&xs)));
                    return None;
                }
                let last = xs[xs.len() - 1].clone();
                if !self.same_or_oblige(&last, inp, arg_tok[0], &callsite) {
                    let mut expected = xs.clone();
                    let n = expected.len();
                    expected[n - 1] = inp.clone();
                    let err = ShapeError {
                        arg: 0,
                        kind: ShapeErrorKind::Mismatch {
                            expected,
                            found: xs,
                            axis: Some(n - 1),
                        },
                        help: Some(format!(
                            "`{shown}` is a Linear with {inp} inputs; its input's last dimension is {last}"
                        )),
                    };
                    self.cx
                        .error_spanned_by(arg_tok[0].to_token_stream(), message(&callsite, &err));
                    return None;
                }
                let w = self.param(
                    pname("weight"),
                    access("weight"),
                    vec![out.clone(), inp.clone()],
                );
                let b = self.param(pname("bias"), access("bias"), vec![out.clone()]);
                // Mixed precision rounds operands and result (`Op::Autocast`, the identity
                // at f32), as PyTorch's autocast runs `linear` in the low precision.
                let w = self.push(Op::Autocast, &[w], &callsite, e, &[])?;
                let b = self.push(Op::Autocast, &[b], &callsite, e, &[])?;
                let x = self.push(Op::Autocast, &[x], &callsite, e, &[arg_tok[0]])?;
                let wt = self.push(Op::Permute { perm: vec![1, 0] }, &[w], &callsite, e, &[])?;
                // Leading axes are rows of one product (`[B, T, C]` as `[B*T, C]`, a view):
                // one GEMM forward and one per gradient, where a batched product would make
                // the weight gradient a `[B, OUT, IN]` stack summed afterwards.
                let lead = &xs[..xs.len() - 1];
                let flat = if lead.len() > 1 {
                    let rows = lead.iter().fold(Dim::known(1), |acc, d| acc.mul(d));
                    let shape = vec![rows, inp.clone()];
                    self.push(Op::Reshape { shape }, &[x], &callsite, e, &[])?
                } else {
                    x
                };
                let y = self.push(Op::MatMul, &[flat, wt], &callsite, e, &[arg_tok[0], e])?;
                let y = self.push(Op::Add, &[y, b], &callsite, e, &[e, e])?;
                let y = self.push(Op::Autocast, &[y], &callsite, e, &[])?;
                if lead.len() > 1 {
                    let mut shape = lead.to_vec();
                    shape.push(out.clone());
                    self.push(Op::Reshape { shape }, &[y], &callsite, e, &[])
                } else {
                    Some(y)
                }
            }
            FieldKind::Conv2d {
                c_in,
                c_out,
                k,
                stride,
                pad,
            } => {
                if !want_args(self, 1) {
                    return None;
                }
                let w = self.param(
                    pname("weight"),
                    access("weight"),
                    vec![c_out.clone(), c_in.clone(), k.clone(), k.clone()],
                );
                let b = self.param(pname("bias"), access("bias"), vec![c_out.clone()]);
                // Rounded as autocast runs `conv2d` (see the Linear case).
                let w = self.push(Op::Autocast, &[w], &callsite, e, &[])?;
                let b = self.push(Op::Autocast, &[b], &callsite, e, &[])?;
                let x = self.push(Op::Autocast, &[args[0]], &callsite, e, &[arg_tok[0]])?;
                let y = self.push(
                    Op::Conv2d {
                        stride: [*stride; 2],
                        padding: [*pad; 2],
                    },
                    &[x, w],
                    &callsite,
                    e,
                    &[arg_tok[0], e],
                )?;
                let b3 = self.push(
                    Op::Reshape {
                        shape: vec![c_out.clone(), Dim::known(1), Dim::known(1)],
                    },
                    &[b],
                    &callsite,
                    e,
                    &[],
                )?;
                let y = self.push(Op::Add, &[y, b3], &callsite, e, &[e, e])?;
                self.push(Op::Autocast, &[y], &callsite, e, &[])
            }
            FieldKind::Embedding { vocab, dim } => {
                if !want_args(self, 1) {
                    return None;
                }
                // Positions index the table: a table shorter than a literal sequence is a
                // mistake now (a symbolic length is checked when the ids are read).
                let ids = self.graph.node(args[0]);
                if let Op::Positions { .. } = ids.op
                    && let (Some(len), Some(rows)) = (
                        ids.shape.first().and_then(|d| d.as_known()),
                        vocab.as_known(),
                    )
                    && len > rows
                {
                    self.cx.error_spanned_by(
                        arg_tok[0].to_token_stream(),
                        format!("shape mismatch in `{callsite}`: the position table has {rows} rows, shorter than the {len} positions it is asked for\n\n= help: make `{shown}` an Embedding<{len}, {dim}> or larger (the model's context), or use a shorter sequence"),
                    );
                    return None;
                }
                let w = self.param(
                    pname("weight"),
                    access("weight"),
                    vec![vocab.clone(), dim.clone()],
                );
                self.push(Op::Embedding, &[w, args[0]], &callsite, e, &[e, arg_tok[0]])
            }
            FieldKind::LayerNorm { dim } => {
                if !want_args(self, 1) {
                    return None;
                }
                let x = args[0];
                let xs = self.shape(x).clone();
                let Some(last) = xs.last().cloned() else {
                    self.cx.error_spanned_by(arg_tok[0].to_token_stream(), format!("shape mismatch in `{callsite}`: expected a tensor ending in {dim}, found a scalar"));
                    return None;
                };
                if !self.same_or_oblige(&last, dim, arg_tok[0], &callsite) {
                    let mut expected = xs.clone();
                    let n = expected.len();
                    expected[n - 1] = dim.clone();
                    let err = ShapeError {
                        arg: 0,
                        kind: ShapeErrorKind::Mismatch {
                            expected,
                            found: xs.clone(),
                            axis: Some(n - 1),
                        },
                        help: None,
                    };
                    self.cx
                        .error_spanned_by(arg_tok[0].to_token_stream(), message(&callsite, &err));
                    return None;
                }
                // Composed from primitives so its backward comes from theirs.
                let ax = vec![xs.len() - 1];
                let mean = self.push(
                    Op::Mean {
                        axes: ax.clone(),
                        keepdim: true,
                    },
                    &[x],
                    &callsite,
                    e,
                    &[],
                )?;
                let xc = self.push(Op::Sub, &[x, mean], &callsite, e, &[])?;
                let sq = self.push(Op::Mul, &[xc, xc], &callsite, e, &[])?;
                let var = self.push(
                    Op::Mean {
                        axes: ax,
                        keepdim: true,
                    },
                    &[sq],
                    &callsite,
                    e,
                    &[],
                )?;
                let eps = self.konst(1e-5);
                let ve = self.push(Op::Add, &[var, eps], &callsite, e, &[])?;
                let sd = self.push(Op::Sqrt, &[ve], &callsite, e, &[])?;
                let xn = self.push(Op::Div, &[xc, sd], &callsite, e, &[])?;
                let w = self.param(pname("weight"), access("weight"), vec![dim.clone()]);
                let b = self.param(pname("bias"), access("bias"), vec![dim.clone()]);
                let y = self.push(Op::Mul, &[xn, w], &callsite, e, &[])?;
                self.push(Op::Add, &[y, b], &callsite, e, &[])
            }
            FieldKind::Param { .. } => {
                self.cx.error_spanned_by(
                    e,
                    format!("`{shown}` is a parameter, not a layer: use it as a value, `{shown}`"),
                );
                None
            }
            FieldKind::Nested { .. } => self.nested_call(sc, member, "forward", None, args, call),
            FieldKind::Repeated { count, .. } => {
                self.cx.error_spanned_by(e, format!("`{shown}` holds {count} blocks; it is not one layer\n\n= help: apply them in turn with `for block in &{shown} {{ x = block(x); }}`, or one of them with `{shown}[0](x)`"));
                None
            }
        }
    }

    /// The unifier's equality (see `rtx_ir::Unifier::same`), with any obligation attributed to
    /// `at`.
    fn same_or_oblige(
        &mut self,
        found: &Dim,
        expected: &Dim,
        at: &dyn ToTokens,
        site: &str,
    ) -> bool {
        let before = self.u.obligations.len();
        let same = self.u.same(expected, found);
        self.defer_obligations(before, at, site);
        same
    }

    fn nested_call(
        &mut self,
        sc: &mut Scope,
        member: &Member,
        method: &str,
        method_tok: Option<&syn::Ident>,
        args: &[NodeId],
        call: &CallSyntax,
    ) -> Option<NodeId> {
        let shown = &member.shown;
        let FieldKind::Nested {
            type_name,
            args: type_args,
            ..
        } = &member.kind
        else {
            let what = if matches!(member.kind, FieldKind::Repeated { .. }) {
                format!(
                    "`{shown}` holds repeated blocks; call one of them: `{shown}[0].{method}(..)`, or each in a `for` loop"
                )
            } else {
                format!("`{shown}` is a layer; it has no graph function `{method}`")
            };
            self.cx.error_spanned_by(&call.whole, what);
            return None;
        };
        let nm = match self.nested.get(type_name) {
            Some(Some(nm)) => nm.clone(),
            Some(None) => {
                self.broken_nested = true;
                return None;
            }
            None => {
                self.cx.error_spanned_by(&call.whole, format!("the graph of nested model `{type_name}` is not available\n\n= help: mark both its struct and its impl with #[model]"));
                return None;
            }
        };
        let mut env = HashMap::new();
        for (p, a) in nm
            .item
            .generics
            .params
            .iter()
            .filter_map(|p| match p {
                syn::GenericParam::Const(c) => Some(c.ident.to_string()),
                _ => None,
            })
            .zip(type_args)
        {
            env.insert(p, a.clone());
        }
        // The nested model was checked by its own expansion; report its failures once, here.
        let quiet = Ctxt::new();
        let inner = ModelStruct::from_item(&nm.item, &env, &quiet);
        let Some(f) = nm.graph.fns.iter().find(|f| f.name == method).cloned() else {
            let at = match method_tok {
                Some(t) => t.to_token_stream(),
                None => call.whole.clone(),
            };
            self.cx.error_spanned_by(
                at,
                format!("nested model `{type_name}` has no graph function `{method}`"),
            );
            return None;
        };
        let mut prefix = sc.prefix.clone();
        prefix.extend(member.path.iter().cloned());
        let callsite = if method_tok.is_none() {
            format!("{shown}(..)")
        } else {
            format!("{shown}.{method}(..)")
        };
        // An error in the nested model's lines here holds for this instance only (its own
        // expansion checked it for every instance): say which one, and where it is nested.
        let values: Vec<String> = inner
            .const_params
            .iter()
            .filter_map(|p| env.get(&p.to_string()).map(|v| format!("{p} = {v}")))
            .collect();
        let instance = if values.is_empty() {
            type_name.clone()
        } else {
            format!("{type_name}<{}>", values.join(", "))
        };
        let context = format!(
            "in `{instance}`, the model of `self.{}` in `{}`",
            join(&sc.prefix, &member.path.join(".")),
            sc.model.name
        );
        self.inline_call(
            &inner,
            &nm.graph.fns,
            prefix,
            env,
            &f,
            args,
            &callsite,
            call,
            Some(context),
        )
    }

    /// Inlines graph function `f` (of `model`) applied to `args`, checking each argument
    /// against its declared shape and binding the callee's symbolic dims.
    #[allow(clippy::too_many_arguments)]
    fn inline_call(
        &mut self,
        model: &ModelStruct,
        fns: &[GraphFnDef],
        prefix: Vec<String>,
        mut env: HashMap<String, Dim>,
        f: &GraphFnDef,
        args: &[NodeId],
        callsite: &str,
        call: &CallSyntax,
        context: Option<String>,
    ) -> Option<NodeId> {
        // A callee whose body did not parse has reported it.
        if f.body_error.is_some() {
            return None;
        }
        let key = format!("{}::{}", model.name, f.name);
        if self.stack.contains(&key) || self.stack.len() > 32 {
            self.cx.error_spanned_by(
                &call.whole,
                format!("`{callsite}` calls itself; graph functions cannot recurse"),
            );
            return None;
        }
        if args.len() != f.inputs.len() {
            self.cx.error_spanned_by(
                &call.whole,
                format!(
                    "`{callsite}` takes {} argument(s), found {}",
                    f.inputs.len(),
                    args.len()
                ),
            );
            return None;
        }
        let mut vars = HashMap::new();
        for (i, (inp, &arg)) in f.inputs.iter().zip(args).enumerate() {
            let found = self.shape(arg).clone();
            let mut expected = Vec::new();
            let mut ok = found.len() == inp.dims.len();
            for (j, d) in inp.dims.iter().enumerate() {
                // A bare symbol of the callee binds to the caller's dimension on first use.
                if let syn::Expr::Path(p) = d
                    && let Some(id) = p.path.get_ident()
                {
                    let name = id.to_string();
                    if f.symbols.iter().any(|s| *s == name)
                        && !env.contains_key(&name)
                        && let Some(fd) = found.get(j)
                    {
                        env.insert(name, fd.clone());
                    }
                }
                match dim_from_expr(d, &[], &model.const_params, &env) {
                    Ok(dim) => {
                        if let Some(fd) = found.get(j) {
                            ok &= self.same_or_oblige(fd, &dim, &call.args[i], callsite);
                        }
                        expected.push(dim);
                    }
                    Err(e) => {
                        if !(context.is_none() && self.fails_alone(model, fns, f)) {
                            self.cx.syn_error(e);
                        }
                        return None;
                    }
                }
            }
            if !ok && context.is_none() && self.fails_alone(model, fns, f) {
                return None;
            }
            if !ok {
                let declared: Vec<String> = inp
                    .dims
                    .iter()
                    .map(|d| d.to_token_stream().to_string())
                    .collect();
                // The callee's names as this call fills them in: `(here D = IN)`.
                let mut filled: Vec<String> = Vec::new();
                for d in &inp.dims {
                    let mut names = Vec::new();
                    dim_names(d, &mut names);
                    for n in names {
                        if let Some(v) = env.get(&n)
                            && v.to_string() != n
                            && !filled.iter().any(|f| f.starts_with(&format!("{n} =")))
                        {
                            filled.push(format!("{n} = {v}"));
                        }
                    }
                }
                let here = if filled.is_empty() {
                    String::new()
                } else {
                    format!(" (here {})", filled.join(", "))
                };
                let help = format!(
                    "`{key}` takes `{}: {}[{}]`{here}",
                    inp.name,
                    if inp.dtype == ElemType::I64 {
                        "i64"
                    } else {
                        ""
                    },
                    declared.join(", ")
                );
                let err = ShapeError {
                    arg: i,
                    kind: ShapeErrorKind::Mismatch {
                        axis: (expected.len() == found.len())
                            .then(|| expected.iter().zip(&found).position(|(a, b)| a != b))
                            .flatten(),
                        expected,
                        found,
                    },
                    help: Some(help),
                };
                self.cx
                    .error_spanned_by(&call.args[i], message(callsite, &err));
                return None;
            }
            let want = if inp.dtype == ElemType::I64 {
                DType::I64
            } else {
                DType::F32
            };
            if self.graph.node(arg).dtype != want {
                if context.is_none() && self.fails_alone(model, fns, f) {
                    return None;
                }
                self.cx.error_spanned_by(
                    &call.args[i],
                    format!(
                        "dtype mismatch in `{callsite}`: argument `{}` must be {}",
                        inp.name,
                        if want == DType::I64 { "i64" } else { "f32" }
                    ),
                );
                return None;
            }
            vars.insert(inp.name.to_string(), Some(arg));
        }
        let mut sc = Scope {
            model,
            fns,
            prefix,
            env,
            symbols: Vec::new(),
            vars,
            aliases: HashMap::new(),
        };
        self.stack.push(key);
        if let Some(note) = &context {
            self.cx.push_context(note.clone());
        }
        let out = self.lower_block(&mut sc, &f.body);
        if context.is_some() {
            self.cx.pop_context();
        }
        self.stack.pop();
        let out = out?;
        // The callee's declared result, for this call's values.
        let Some(declared) = f
            .output
            .iter()
            .map(|d| dim_from_expr(d, &[], &model.const_params, &sc.env).ok())
            .collect::<Option<Shape>>()
        else {
            // An unknown name in the signature: reported where the callee is lowered alone.
            return None;
        };
        let computed = self.shape(out).clone();
        let before = self.u.obligations.len();
        let same = self.u.same_shape(&declared, &computed);
        self.defer_obligations(before, &call.whole, callsite);
        if same {
            return Some(out);
        }
        // Called with its own names (a helper of the same model), the callee's own lowering
        // reports the mismatch; for other values (a nested model's instance, a helper called
        // with `T = B + E`) it holds for this call only, and is reported here.
        let identity = context.is_none()
            && sc
                .env
                .iter()
                .all(|(k, v)| *v == Dim::sym(k) || *v == Dim::param(k));
        if !identity {
            let mut names: Vec<String> = sc
                .env
                .iter()
                .filter(|(k, v)| v.to_string() != **k)
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            names.sort();
            let here = if names.is_empty() {
                String::new()
            } else {
                format!(" (here {})", names.join(", "))
            };
            let mut msg = format!(
                "shape mismatch in the result of `{callsite}`: `{}::{}` declares {}, its body computes {} for this call{here}",
                model.name,
                f.name,
                fmt_shape(&declared),
                fmt_shape(&computed),
            );
            if let Some(note) = &context {
                msg = format!("{msg}\n\n= note: {note}");
            }
            self.cx.error_spanned_by(&call.whole, msg);
        }
        None
    }

    /// True when graph function `f` of `model` fails when lowered on its own: it reports its
    /// errors there, and a call whose arguments disagree with its signature adds none (the
    /// signature may be the mistake: `fn forward(ids: [B, T])` read by an embedding, called
    /// with `i64` ids). Run only when a call's arguments fail, with its errors discarded.
    fn fails_alone(&self, model: &ModelStruct, fns: &[GraphFnDef], f: &GraphFnDef) -> bool {
        let quiet = Ctxt::new();
        let mut lw = Lowerer::new(&quiet, self.nested);
        let graph = GraphDef { fns: fns.to_vec() };
        let out = lw.lower_fn(model, &graph, f);
        out.is_none() || quiet.has_errors()
    }

    /// An axis argument of the tensor of shape `shape` (negative counts from the end).
    fn axis_arg(&self, e: &syn::Expr, shape: &[Dim], what: &str) -> Option<usize> {
        let Some(v) = int_literal(e) else {
            self.cx
                .error_spanned_by(e, format!("the {what} must be an integer literal"));
            return None;
        };
        let rank = shape.len();
        let r = rank as i64;
        if v < -r || v >= r {
            self.cx.error_spanned_by(
                e,
                format!(
                    "{what} {v} is out of range for a tensor of shape {} (rank {rank})\n\n= help: valid axes are 0..{rank}, or -{rank}..-1 counted from the end",
                    fmt_shape(shape)
                ),
            );
            return None;
        }
        Some(if v < 0 { (v + r) as usize } else { v as usize })
    }

    /// The `-1` of a target shape: the input's element count divided by the other target
    /// dimensions (`shape` holds 1 in the `-1`'s place), when that division is exact.
    fn infer_minus_one(
        &self,
        op: &str,
        from: &[Dim],
        shape: &[Dim],
        at: &syn::Expr,
    ) -> Option<Dim> {
        let numel = from.iter().fold(Dim::known(1), |acc, d| acc.mul(d));
        let others = shape.iter().fold(Dim::known(1), |acc, d| acc.mul(d));
        // Over a generic size the quotient may need a division (`D / 4` of `[B, T, D]` to
        // `[B, T, 4, -1]`): it is `floor(..)`, and the reshape's element count becomes a
        // relation checked when the model is instantiated (D a multiple of 4).
        let generic_quotient = || {
            let (atoms, coeff) = others.terms().next()?;
            let monomial = atoms
                .iter()
                .fold(Dim::known(1), |acc, a| acc.mul(&atom_dim(a)));
            let q = numel.exact_div(&monomial)?;
            (others.terms().count() == 1 && coeff > 1 && q.has_param() && !q.has_sym())
                .then(|| q.floor_div(coeff as u64))
        };
        match numel.exact_div(&others).or_else(generic_quotient) {
            Some(d) if d.as_const().is_none_or(|v| v >= 1) => Some(d),
            _ => {
                self.cx.error_spanned_by(
                    at,
                    format!(
                        "cannot infer the -1 in `{op}`: the input {} has {numel} elements, which is not a whole multiple of {others} (the product of the other target dimensions)\n\n= help: write the dimension out, or change the others so they divide {numel}",
                        fmt_shape(from)
                    ),
                );
                None
            }
        }
    }

    /// Float labels in `cross_entropy` get their own message: the fix is in the signature.
    fn check_labels_dtype(&mut self, labels: NodeId, arg: &syn::Expr) -> Option<()> {
        if self.graph.node(labels).dtype == DType::I64 {
            return Some(());
        }
        let ys = fmt_shape(self.shape(labels));
        let decl = match arg {
            syn::Expr::Path(p) if p.path.get_ident().is_some() => {
                format!("`{}: i64{ys}`", p.to_token_stream())
            }
            _ => format!("`y: i64{ys}`"),
        };
        self.cx.error_spanned_by(
            arg,
            format!("dtype mismatch in `cross_entropy(..)`: the labels must be integer class indices (i64), found a float tensor of shape {ys}\n\n= help: declare the labels as integers in the signature, e.g. {decl}"),
        );
        None
    }

    /// Parses a library op's arguments by the kinds of its parameters. Axes are resolved
    /// against the first tensor (or the first tensor of the list). Returns the arguments and
    /// the span of every tensor the user passed.
    fn library_args(
        &mut self,
        sc: &mut Scope,
        def: &LibraryOp,
        a: &[&syn::Expr],
        whole: &syn::Expr,
    ) -> Option<(Args, Vec<(NodeId, TokenStream)>)> {
        let mut args = Vec::with_capacity(def.params.len());
        let mut value_tokens = Vec::new();
        let mut axes_of: Option<Shape> = None;
        let op = def.name;
        for (i, param) in def.params.iter().enumerate() {
            let x = a.get(i).copied();
            let what = format!("{op} {}", param.name().replace('_', " "));
            let arg = match (*param, x) {
                (Param::Tensor(_), Some(x)) => {
                    let v = self.lower_expr(sc, x)?;
                    axes_of.get_or_insert_with(|| self.shape(v).clone());
                    value_tokens.push((v, x.to_token_stream()));
                    Arg::Tensor(v)
                }
                (Param::Tensors(_), Some(x)) => {
                    let syn::Expr::Array(list) = x else {
                        self.cx.error_spanned_by(
                            x,
                            format!("`{op}` takes a list of tensors here, e.g. `{op}([a, b], 1)`"),
                        );
                        return None;
                    };
                    let mut parts = Vec::with_capacity(list.elems.len());
                    for el in &list.elems {
                        let v = self.lower_expr(sc, el)?;
                        value_tokens.push((v, el.to_token_stream()));
                        parts.push(v);
                    }
                    if let Some(&first) = parts.first() {
                        axes_of.get_or_insert_with(|| self.shape(first).clone());
                    }
                    Arg::Tensors(parts)
                }
                (Param::Number(_, _), Some(x)) => match literal(x) {
                    Some(v) => Arg::Number(v),
                    None => {
                        self.cx.error_spanned_by(
                            x,
                            format!(
                                "this argument of `{op}` must be a number literal\n\n= help: the form is `{}`",
                                def.signature()
                            ),
                        );
                        return None;
                    }
                },
                (Param::Number(_, Some(default)), None) => Arg::Number(default),
                (Param::Size(name, _), Some(x)) => match int_literal(x) {
                    Some(v) if v >= 0 => Arg::Size(Some(v as usize)),
                    _ => {
                        self.cx.error_spanned_by(
                            x,
                            format!(
                                "the `{name}` of `{op}` must be a non-negative integer literal"
                            ),
                        );
                        return None;
                    }
                },
                (Param::Size(_, false), None) => Arg::Size(None),
                (Param::Axis(..), Some(x)) => {
                    let shape = axes_of.clone().unwrap_or_default();
                    Arg::Axes(Some(vec![self.axis_arg(x, &shape, &what)?]))
                }
                (Param::Axes(..), Some(x)) => {
                    let shape = axes_of.clone().unwrap_or_default();
                    let mut axes = Vec::new();
                    match x {
                        syn::Expr::Array(list) => {
                            for el in &list.elems {
                                axes.push(self.axis_arg(el, &shape, &what)?);
                            }
                        }
                        single => axes.push(self.axis_arg(single, &shape, &what)?),
                    }
                    Arg::Axes(Some(axes))
                }
                (Param::Axis(_, false) | Param::Axes(_, false), None) => Arg::Axes(None),
                (Param::Flag(name), Some(k)) => {
                    // PyTorch's keyword form too: `keepdim = true`; the bare name means true.
                    let value = match k {
                        syn::Expr::Assign(a) if a.left.to_token_stream().to_string() == name => {
                            &*a.right
                        }
                        other => other,
                    };
                    match value.to_token_stream().to_string().as_str() {
                        "true" => Arg::Flag(true),
                        "false" => Arg::Flag(false),
                        bare if bare == name => Arg::Flag(true),
                        _ => {
                            self.cx.error_spanned_by(
                                k,
                                format!("expected `{name}`, `true`, `false` or `{name} = true`"),
                            );
                            return None;
                        }
                    }
                }
                (Param::Flag(_), None) => Arg::Flag(false),
                (Param::Dims(_), Some(x)) => {
                    let syn::Expr::Array(list) = x else {
                        self.cx.error_spanned_by(
                            x,
                            format!("the target shape of `{op}` is a list of dimensions, e.g. `[B, 8, 8]`"),
                        );
                        return None;
                    };
                    let mut shape = Vec::with_capacity(list.elems.len());
                    let mut inferred: Option<(usize, &syn::Expr)> = None;
                    for (i, el) in list.elems.iter().enumerate() {
                        if int_literal(el) == Some(-1) {
                            if inferred.is_some() {
                                self.cx.error_spanned_by(
                                    el,
                                    format!(
                                        "only one dimension of `{op}`'s target shape can be -1"
                                    ),
                                );
                                return None;
                            }
                            inferred = Some((i, el));
                            shape.push(Dim::known(1));
                            continue;
                        }
                        match dim_from_expr(el, &sc.symbols, &sc.model.const_params, &sc.env) {
                            Ok(d) => shape.push(d),
                            Err(err) => {
                                self.cx.syn_error(err);
                                return None;
                            }
                        }
                    }
                    if let Some((i, el)) = inferred {
                        let from = axes_of.clone().unwrap_or_default();
                        shape[i] = self.infer_minus_one(op, &from, &shape, el)?;
                    }
                    Arg::Dims(shape)
                }
                (p, None) => {
                    self.cx.error_spanned_by(
                        whole,
                        format!(
                            "`{op}` needs its `{}` argument\n\n= help: the form is `{}`",
                            p.name(),
                            def.signature()
                        ),
                    );
                    return None;
                }
            };
            args.push(arg);
        }
        Some((Args(args), value_tokens))
    }

    fn lower_call(&mut self, sc: &mut Scope, c: &syn::ExprCall, e: &syn::Expr) -> Option<NodeId> {
        // self.blocks[0](x), or block(x) in a loop over them
        if let Some(member) = self.member_of(sc, &c.func) {
            let args: Vec<Option<NodeId>> = c.args.iter().map(|a| self.lower_expr(sc, a)).collect();
            let member = member?;
            let args: Vec<NodeId> = args.into_iter().collect::<Option<_>>()?;
            let call = CallSyntax::new(e, c.args.iter().cloned());
            return self.layer_call(sc, &member, &args, &call, e);
        }
        let syn::Expr::Path(fp) = &*c.func else {
            self.cx.error_spanned_by(&c.func, "expected an op name");
            return None;
        };
        let name = fp
            .path
            .get_ident()
            .map(|i| syn::ext::IdentExt::unraw(i).to_string())
            .unwrap_or_else(|| fp.path.to_token_stream().to_string());
        let a: Vec<&syn::Expr> = c.args.iter().collect();
        if let Some(def) = rtx_ir::library::lookup(&name) {
            let required = def.params.iter().filter(|p| p.required()).count();
            if a.len() < required || a.len() > def.params.len() {
                self.cx.error_spanned_by(
                    e,
                    format!(
                        "`{name}` takes `{}`, found {} argument(s)",
                        def.signature(),
                        a.len()
                    ),
                );
                return None;
            }
            let (args, value_tokens) = self.library_args(sc, def, &a, e)?;
            if def.name == "cross_entropy" {
                self.check_labels_dtype(args.tensor(1).ok()?, a[1])?;
            }
            let param_tokens: Vec<TokenStream> = (0..def.params.len())
                .map(|i| match a.get(i) {
                    Some(x) => x.to_token_stream(),
                    None => e.to_token_stream(),
                })
                .collect();
            return self.library_call(def, &args, e, &param_tokens, &value_tokens);
        }
        let help = suggest(&name)
            .map(|s| format!("did you mean `{s}`? "))
            .unwrap_or_default();
        self.cx.error_spanned_by(
            &c.func,
            format!(
                "unknown op `{name}` in graph!\n\n= help: {help}{}",
                ops_help()
            ),
        );
        None
    }
}
