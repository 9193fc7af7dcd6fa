//! Locks in what `#[model]` and `graph!` say: every file under `ui/fail` must be rejected with
//! exactly the diagnostics of its `.stderr`, every file under `ui/pass` must build and run.
//!
//! Regenerate after an intended wording change: `TRYBUILD=overwrite cargo test -p ui-tests`,
//! then read every changed `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
