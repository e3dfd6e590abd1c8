//! docs/ARCHITECTURE.md's module tables are true: every top-level module
//! of each crate (`src/NAME.rs` or `src/NAME/`) has its row, and every row
//! names a module that exists. A newcomer looks there first; a table that
//! drifts from the code sends them to files that are gone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The crates whose modules the document maps, and the heading of the
/// section holding each one's table.
const MAPPED: &[(&str, &str)] = &[
    ("protocol", "### `berth-protocol`"),
    ("store", "### `berth-store`"),
    ("events", "### `berth-events`"),
    ("broker", "### `berth-broker`"),
    ("server", "## Inside `berth-server`"),
    ("cluster", "### `berth-cluster`"),
    ("cli", "### `berth-cli`"),
    ("bench", "### `berth-bench`"),
    ("itest", "### `berth-itest`"),
];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf()
}

/// `src`'s top-level modules (`lib.rs` and `main.rs` are the crate root).
fn modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .expect("src dir")
        .map(|e| e.expect("dir entry").path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            match name.strip_suffix(".rs") {
                Some(stem) => Some(stem.to_owned()),
                None if p.is_dir() => Some(name),
                None => None,
            }
        })
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

/// The first column of the first table after `heading`: "| `name` |" or
/// "| `name/` |" rows, up to the table's end.
fn table_rows(doc: &str, heading: &str) -> Result<BTreeSet<String>, String> {
    let at = doc
        .lines()
        .position(|l| l.trim_end() == heading)
        .ok_or_else(|| format!("no heading {heading:?}"))?;
    let mut rows = BTreeSet::new();
    let mut in_table = false;
    for line in doc.lines().skip(at + 1) {
        if line.starts_with('#') {
            break;
        }
        if !line.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        in_table = true;
        let first = line.trim_start_matches('|').split('|').next().unwrap_or("");
        if let Some(name) = first.trim().strip_prefix('`') {
            let name = name.split('`').next().unwrap_or("");
            let name = name.trim_end_matches('/').trim_end_matches(".rs");
            rows.insert(name.to_owned());
        }
    }
    if rows.is_empty() {
        return Err(format!("no module table after {heading:?}"));
    }
    Ok(rows)
}

/// What is wrong with `rows` as the map of `modules`, if anything.
fn drift(krate: &str, modules: &BTreeSet<String>, rows: &BTreeSet<String>) -> Vec<String> {
    let mut wrong = Vec::new();
    for m in modules.difference(rows) {
        wrong.push(format!("berth-{krate}: module `{m}` has no row"));
    }
    for r in rows.difference(modules) {
        // The server's table also explains its root, `lib.rs`.
        if r != "lib" {
            wrong.push(format!("berth-{krate}: row `{r}` names no module"));
        }
    }
    wrong
}

#[test]
fn every_module_of_every_crate_has_its_row_and_no_row_is_stale() {
    let crates = crates_dir();
    let doc = std::fs::read_to_string(crates.join("../docs/ARCHITECTURE.md"))
        .expect("docs/ARCHITECTURE.md");
    let mut wrong = Vec::new();
    for (krate, heading) in MAPPED {
        match table_rows(&doc, heading) {
            Ok(rows) => wrong.extend(drift(
                krate,
                &modules(&crates.join(krate).join("src")),
                &rows,
            )),
            Err(e) => wrong.push(format!("berth-{krate}: {e}")),
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/ARCHITECTURE.md's module tables disagree with the code \
         (add or remove the rows):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_module_missing_from_its_table_is_named() {
    let modules: BTreeSet<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
    let doc = "### `berth-x`\n\n| module | what |\n|---|---|\n| `a` | one |\n| `gone/` | two |\n";
    let rows = table_rows(doc, "### `berth-x`").expect("a table");
    assert_eq!(
        drift("x", &modules, &rows),
        vec![
            "berth-x: module `b` has no row".to_string(),
            "berth-x: row `gone` names no module".to_string()
        ]
    );
}
