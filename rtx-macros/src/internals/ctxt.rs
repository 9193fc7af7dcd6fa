//! Collects every spanned error of one macro input, so all of them are reported together.
//! Like serde_derive's `Ctxt`: it must be checked (`check`) before expansion proceeds.

use quote::ToTokens;
use std::cell::RefCell;
use std::fmt::Display;

#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
    /// Notes added to every error reported while they are set: which instance of a nested
    /// model is being checked, when the error is in that model's own lines.
    context: RefCell<Vec<String>>,
}

impl Ctxt {
    pub fn new() -> Ctxt {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
            context: RefCell::new(Vec::new()),
        }
    }

    /// An error spanning all of `tokens` (first to last token, as rustc underlines it).
    pub fn error_spanned_by<T: ToTokens, M: Display>(&self, tokens: T, msg: M) {
        let mut msg = msg.to_string();
        for note in self.context.borrow().iter().rev() {
            let sep = if msg.contains("\n\n= ") { "\n" } else { "\n\n" };
            msg = format!("{msg}{sep}= note: {note}");
        }
        self.push(syn::Error::new_spanned(tokens.into_token_stream(), msg));
    }

    /// Adds `note` to the errors reported until the matching `pop_context`.
    pub fn push_context(&self, note: String) {
        self.context.borrow_mut().push(note);
    }

    pub fn pop_context(&self) {
        self.context.borrow_mut().pop();
    }

    pub fn syn_error(&self, err: syn::Error) {
        self.push(err);
    }

    fn push(&self, e: syn::Error) {
        if let Some(v) = self.errors.borrow_mut().as_mut() {
            v.push(e);
        }
    }

    pub fn has_errors(&self) -> bool {
        self.errors.borrow().as_ref().is_some_and(|v| !v.is_empty())
    }

    /// All errors combined into one, or Ok when there were none.
    pub fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().unwrap_or_default();
        let mut iter = errors.into_iter();
        match iter.next() {
            None => Ok(()),
            Some(mut first) => {
                for e in iter {
                    first.combine(e);
                }
                Err(first)
            }
        }
    }
}
