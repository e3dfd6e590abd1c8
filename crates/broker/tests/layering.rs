//! The broker's modules depend on each other one way only: no module uses
//! one that (directly or through others) uses it back. A circle is what
//! made queue, vhost, channel and exchange hard to change one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name → the crate modules its code (comments excluded) refers to
/// as `crate::name`. A submodule's file (`queue/settings.rs`) counts as
/// part of its top-level module (`queue`): a circle through a submodule
/// is a circle of its module. `lib.rs` only declares and re-exports, so it
/// is left out.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, path) in source_files(src) {
        let text = std::fs::read_to_string(&path).expect("readable source");
        let uses = graph.entry(name.clone()).or_default();
        for line in text.lines().map(str::trim_start) {
            if line.starts_with("//") {
                continue;
            }
            let mut rest = line;
            while let Some(at) = rest.find("crate::") {
                rest = &rest[at + "crate::".len()..];
                // `crate::{a, b::c}` names several modules at once.
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(list) => list
                        .split(['}', ';'])
                        .next()
                        .unwrap_or("")
                        .split(',')
                        .map(str::trim)
                        .collect(),
                    None => vec![rest],
                };
                for n in names {
                    let m: String = n
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !m.is_empty() && m != name {
                        uses.insert(m);
                    }
                }
            }
        }
    }
    graph
}

/// Every `.rs` file under `src`, at any depth, with the top-level module
/// it belongs to (`queue.rs` and `queue/settings.rs`: `queue`).
fn source_files(src: &Path) -> Vec<(String, std::path::PathBuf)> {
    fn walk(dir: &Path, top: Option<&str>, out: &mut Vec<(String, std::path::PathBuf)>) {
        for entry in std::fs::read_dir(dir).expect("src dir") {
            let path = entry.expect("dir entry").path();
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let module = top.unwrap_or(stem).to_owned();
            if path.is_dir() {
                walk(&path, Some(&module), out);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs")
                && !(top.is_none() && stem == "lib")
            {
                out.push((module, path));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, None, &mut out);
    out
}

/// A cycle in the graph, as a path that starts and ends at one module.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_owned());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn broker_modules_form_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.len() >= 5, "read the broker's modules: {graph:?}");

    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "broker modules import each other in a circle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_checker_sees_a_circle() {
    let mut g = BTreeMap::new();
    g.insert("queue".to_owned(), BTreeSet::from(["vhost".to_owned()]));
    g.insert("vhost".to_owned(), BTreeSet::from(["exchange".to_owned()]));
    g.insert("exchange".to_owned(), BTreeSet::from(["queue".to_owned()]));
    assert_eq!(
        find_cycle(&g).map(|c| c.len()),
        Some(4),
        "queue -> vhost -> exchange -> queue"
    );
    g.get_mut("exchange").expect("exchange").clear();
    assert_eq!(find_cycle(&g), None);
}

#[test]
fn a_circle_through_a_submodule_is_seen() {
    let dir = berth_testdir::TestDir::new("layering");
    std::fs::create_dir_all(dir.join("b")).expect("temp dir");
    std::fs::write(dir.join("a.rs"), "use crate::b::Thing;\n").expect("write a.rs");
    std::fs::write(dir.join("b.rs"), "mod inner;\n").expect("write b.rs");
    std::fs::write(dir.join("b/inner.rs"), "use crate::a::Other;\n").expect("write inner.rs");
    let graph = module_graph(&dir);
    assert_eq!(
        find_cycle(&graph).map(|c| c.len()),
        Some(3),
        "a -> b (through b/inner.rs) -> a: {graph:?}"
    );
}
