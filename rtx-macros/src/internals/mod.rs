//! Parsing and checking, before any code is emitted (the serde_derive split): `ast` reads the
//! items, `lower` builds the IR and checks every shape, `ctxt` collects the errors.

pub mod ast;
pub mod ctxt;
pub mod impl_input;
mod library_call;
pub mod lower;
mod repeat;
mod syntax;
