//! Repeated blocks in graph bodies: a field `blocks: [Block; 4]` is applied one block at a
//! time, `self.blocks[2](x)`, or in turn by a loop,
//! `for block in &self.blocks { x = block(x); }`. Each block has its own parameters
//! (`blocks.2.attn.qkv.weight`), so the loop is unrolled into the IR: every pass is inlined
//! with its own prefix, and the fusion planner and the schedule see one flat graph.

use super::ast::FieldKind;
use super::lower::{Lowerer, Member, Scope};
use super::syntax::{int_literal, is_self, member_name, pattern_names};
use rtx_ir::NodeId;
use std::collections::{HashMap, HashSet};

impl Lowerer<'_> {
    /// The block `e` names: one of repeated blocks (`self.blocks[2]`) or a loop variable bound
    /// to one. `None` when `e` names no block; `Some(None)` when it tries to and is wrong
    /// (reported here).
    pub(super) fn member_of(&self, sc: &Scope, e: &syn::Expr) -> Option<Option<Member>> {
        match e {
            syn::Expr::Paren(p) => self.member_of(sc, &p.expr),
            syn::Expr::Path(p) => {
                let id = p.path.get_ident()?.to_string();
                sc.aliases.get(&id).cloned().map(Some)
            }
            syn::Expr::Index(ix) => {
                let syn::Expr::Field(f) = &*ix.expr else {
                    return None;
                };
                if !is_self(&f.base) {
                    return None;
                }
                let name = member_name(&f.member);
                let Some(field) = sc.model.field(&name) else {
                    self.unknown_field(sc, &f.member, &name);
                    return Some(None);
                };
                let FieldKind::Repeated { count, item } = &field.kind else {
                    self.cx.error_spanned_by(
                        e,
                        format!("`self.{name}` is not an array of blocks; only fields such as `blocks: [Block; 4]` are indexed"),
                    );
                    return Some(None);
                };
                let Some(i) = int_literal(&ix.index) else {
                    self.cx.error_spanned_by(
                        &ix.index,
                        format!("the index of `self.{name}[..]` must be an integer literal\n\n= help: to apply every block in turn, write `for block in &self.{name} {{ x = block(x); }}`"),
                    );
                    return Some(None);
                };
                let count_value: usize = *count;
                if i < 0 || i as usize >= count_value {
                    self.cx.error_spanned_by(
                        &ix.index,
                        format!("index {i} is out of range: `self.{name}` holds {count} blocks, indices 0..{count}"),
                    );
                    return Some(None);
                }
                Some(Some(Member {
                    path: vec![name.clone(), i.to_string()],
                    shown: format!("self.{name}[{i}]"),
                    kind: item.as_ref().clone(),
                }))
            }
            _ => None,
        }
    }

    /// A block read as a value: a parameter (`self.gains[1]`) is one; a layer must be called.
    pub(super) fn member_value(
        &mut self,
        sc: &Scope,
        member: &Member,
        e: &syn::Expr,
    ) -> Option<NodeId> {
        let shown = &member.shown;
        let FieldKind::Param { shape } = &member.kind else {
            self.cx
                .error_spanned_by(e, format!("`{shown}` is a layer; call it: `{shown}(x)`"));
            return None;
        };
        let mut path = sc.prefix.clone();
        path.extend(member.path.iter().cloned());
        let name = path.join(".");
        path.push("value".to_string());
        Some(self.param(name, path, shape.clone()))
    }

    /// `x = expr;`: rebinds a name already in scope (in a loop body, an outer name keeps the
    /// last pass's value). False when it failed (reported, or reading a poisoned value).
    pub(super) fn lower_assign(&mut self, sc: &mut Scope, a: &syn::ExprAssign) -> bool {
        let name = match &*a.left {
            syn::Expr::Path(p) if p.path.get_ident().is_some() => p
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default(),
            other => {
                self.cx
                    .error_spanned_by(other, "graph! assigns only to names: `x = block(x);`");
                return false;
            }
        };
        if !sc.vars.contains_key(&name) {
            self.cx.error_spanned_by(
                &a.left,
                format!("cannot assign to `{name}`: no value of that name is in scope\n\n= help: bind it first: `let {name} = ..;`"),
            );
            return false;
        }
        let value = self.lower_expr(sc, &a.right);
        sc.vars.insert(name, value);
        value.is_some()
    }

    /// `for block in &self.blocks { .. }`: the body once per block, in order, with `block`
    /// bound to it. Names bound in the body end with each pass; assignments to names from
    /// outside it carry over. The loop stops at the first pass that fails (its error stands
    /// for the rest, which would repeat it).
    pub(super) fn lower_for(&mut self, sc: &mut Scope, l: &syn::ExprForLoop) -> bool {
        let syn::Pat::Ident(pi) = &*l.pat else {
            self.cx.error_spanned_by(
                &l.pat,
                "a `for` loop in graph! binds one name: `for block in &self.blocks`",
            );
            return false;
        };
        let var = pi.ident.to_string();
        let mut iterable = &*l.expr;
        loop {
            iterable = match iterable {
                syn::Expr::Reference(r) => &r.expr,
                syn::Expr::Paren(p) => &p.expr,
                syn::Expr::MethodCall(m) if m.method == "iter" && m.args.is_empty() => &m.receiver,
                _ => break,
            };
        }
        let field = match iterable {
            syn::Expr::Field(f) if is_self(&f.base) => member_name(&f.member),
            _ => {
                self.cx.error_spanned_by(
                    &l.expr,
                    "a `for` loop in graph! runs over repeated blocks: `for block in &self.blocks`, where the model has a field `blocks: [Block; N]`",
                );
                return false;
            }
        };
        let Some(kind) = sc.model.field(&field).map(|f| f.kind.clone()) else {
            self.unknown_field(sc, iterable, &field);
            return false;
        };
        let FieldKind::Repeated { count, item } = kind else {
            self.cx.error_spanned_by(
                iterable,
                format!("`self.{field}` is not an array of blocks: a `for` loop in graph! runs over a field such as `blocks: [Block; 4]`"),
            );
            return false;
        };
        // The loop variable hides a value of the same name for the loop's length.
        let hidden_var = sc.vars.remove(&var);
        let hidden_alias = sc.aliases.remove(&var);
        let mut ok = true;
        for i in 0..count {
            sc.aliases.insert(
                var.clone(),
                Member {
                    path: vec![field.clone(), i.to_string()],
                    shown: var.clone(),
                    kind: (*item).clone(),
                },
            );
            if i > 0 {
                self.cx
                    .push_context(format!("in the loop's pass over `self.{field}[{i}]`"));
            }
            ok = self.lower_pass(sc, &l.body);
            if i > 0 {
                self.cx.pop_context();
            }
            if !ok {
                break;
            }
        }
        sc.aliases.remove(&var);
        if let Some(a) = hidden_alias {
            sc.aliases.insert(var.clone(), a);
        }
        if let Some(v) = hidden_var {
            sc.vars.insert(var, v);
        }
        ok
    }

    /// One pass of a loop body.
    fn lower_pass(&mut self, sc: &mut Scope, body: &syn::Block) -> bool {
        let outer = sc.vars.clone();
        // An outer name's value when a `let` in the body first hid it.
        let mut hidden: HashMap<String, Option<NodeId>> = HashMap::new();
        let mut locals: HashSet<String> = HashSet::new();
        let mut ok = true;
        for stmt in &body.stmts {
            ok &= match stmt {
                syn::Stmt::Local(local) => {
                    let mut names = Vec::new();
                    pattern_names(&local.pat, &mut names);
                    for n in names {
                        if outer.contains_key(&n) && !locals.contains(&n) {
                            hidden.insert(n.clone(), sc.vars.get(&n).copied().flatten());
                        }
                        sc.aliases.remove(&n);
                        locals.insert(n);
                    }
                    self.lower_let(sc, local)
                }
                syn::Stmt::Expr(syn::Expr::ForLoop(inner), _) => self.lower_for(sc, inner),
                syn::Stmt::Expr(syn::Expr::Assign(a), _) => self.lower_assign(sc, a),
                other => {
                    self.cx.error_spanned_by(
                        other,
                        "a `for` body in graph! holds `let` bindings and assignments such as `x = block(x);`",
                    );
                    false
                }
            };
        }
        let mut after = HashMap::with_capacity(outer.len());
        for name in outer.keys() {
            let value = match hidden.get(name) {
                Some(v) => *v,
                None => sc.vars.get(name).copied().flatten(),
            };
            after.insert(name.clone(), value);
        }
        sc.vars = after;
        ok
    }
}
