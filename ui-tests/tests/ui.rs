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

/// What the compiler says never names the macros' hidden items (`__rtx_..` callbacks, `__d_B`
/// dimension bindings, `__model_impl`) or the type-level checks (`DimEq`, `DimCheck`): a user
/// cannot act on them, and rustc must not suggest them as a fix.
///
/// One known exception: `#[model] impl Mpl` with no `#[model] struct Mpl` (a misspelled type)
/// calls the struct's hidden callback, and rustc reports that it is missing next to the real
/// error ("cannot find type `Mpl`", with the right suggestion). The macro namespace has room
/// for one macro per type name, and that one carries the impl's definition to models that
/// nest it, which must work across modules.
const KNOWN_HIDDEN_NAME: &[&str] = &["impl_type_typo.stderr"];

#[test]
fn no_diagnostic_names_a_hidden_item() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/fail");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("ui/fail is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "stderr") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a .stderr is text");
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        if KNOWN_HIDDEN_NAME.contains(&file) {
            assert!(text.contains("cannot find type `Mpl`"), "{text}");
            continue;
        }
        // `__` starting a name (`__rtx_graph_..`, `__d_B`); rustc's underlines are `____^`.
        let hidden_name = text
            .match_indices("__")
            .any(|(i, _)| text[i + 2..].starts_with(|c: char| c.is_ascii_alphanumeric()));
        assert!(
            !hidden_name && !text.contains("DimEq") && !text.contains("DimCheck"),
            "{} names a hidden item:\n{text}",
            path.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 40,
        "only {checked} .stderr files found in {}",
        dir.display()
    );
}
