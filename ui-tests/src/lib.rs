//! ui-tests: compile-fail and compile-pass cases that lock in the diagnostics of the model DSL
//! (`#[model]`, `graph!`).
//!
//! `tests/ui/fail/*.rs` are small models that must be rejected at `cargo check`, each with the
//! exact compiler output in its `.stderr` (the op, both shapes, the dimension that differs, the
//! span of the user's sub-expression, a `= help:` where the fix is known); `tests/ui/pass/*.rs`
//! must build and run a real forward (and backward) pass. `tests/ui.rs` drives them through
//! trybuild: `cargo test -p ui-tests`; after an intended change of wording,
//! `TRYBUILD=overwrite cargo test -p ui-tests` and read every changed `.stderr`.
