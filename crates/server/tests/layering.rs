//! The server's modules depend on each other one way only, submodules
//! included: no module uses one that (directly or through others) uses it
//! back, and the AMQP side (`connection`) never reaches the HTTP side
//! (`http`). A circle through `connection`, `http` and `auth` is what made
//! the server hard to read and to change one part at a time.
//!
//! How the graph is read: a file `a/b.rs` is module `a::b`, `a/mod.rs` is
//! module `a`; `lib.rs`, the crate root that only wires the modules
//! together, is left out. Every `crate::x::y` and `super::x` path in code
//! (comments excluded, `{a, b}` groups expanded) is an edge to the deepest
//! module it names; a path to an item of the crate root (`crate::Config`)
//! is no edge. A module naming its own submodules by their bare name
//! (`http.rs` routing to `queues::list`) is how Rust composes a module and
//! is no edge either; a submodule reaching back up (`super::HttpState`)
//! is. The same edges are also checked folded onto top-level modules
//! (`http::queues -> connection` counts as `http -> connection`), so a
//! circle between two parts cannot hide in their files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every source file under `dir` as (module path, file text).
fn modules(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            modules(src, &path, out);
            continue;
        }
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let rel = path.strip_prefix(src).expect("under src");
        let mut segs: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if segs.last().is_some_and(|s| s == "mod") {
            segs.pop();
        }
        if segs == ["lib"] {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        out.push((segs.join("::"), text));
    }
}

/// The paths (as segments) at the start of `s`: `a::b` gives one,
/// `{a, b::{c, d}}` gives `a`, `b::c`, `b::d`.
fn paths_after(s: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> (&str, &str) {
        let end = s
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        s.split_at(end)
    }
    fn group(s: &str) -> Vec<&str> {
        // The items of a `{...}` group at its top level.
        let (mut depth, mut start, mut items) = (0, 0, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    items.push(&s[start..i]);
                    return items;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&s[start..]);
        items
    }
    let s = s.trim_start();
    if let Some(inner) = s.strip_prefix('{') {
        return group(inner).into_iter().flat_map(paths_after).collect();
    }
    let (name, rest) = ident(s);
    if name.is_empty() {
        // A trailing comma's empty item, or a glob: no path.
        return Vec::new();
    }
    let Some(rest) = rest.strip_prefix("::") else {
        return vec![vec![name.to_owned()]];
    };
    paths_after(rest)
        .into_iter()
        .map(|mut p| {
            p.insert(0, name.to_owned());
            p
        })
        .collect()
}

/// The modules `text` (the code of module `me`) refers to, resolved
/// against `known` to the deepest module each path names.
fn references(me: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let me_segs: Vec<&str> = me.split("::").collect();
    // Code without comment lines, as one string: a `use` group may span
    // lines.
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut uses = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(['c', 's']).map(|i| from + i) {
        let here = &code[at..];
        from = at + 1;
        // Only whole words: `mycrate::` or `dosuper::` are not paths.
        let word_start = !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let (base, after): (Vec<&str>, &str) = if !word_start {
            (Vec::new(), "")
        } else if let Some(after) = here.strip_prefix("crate::") {
            (Vec::new(), after)
        } else if here.starts_with("super::") {
            let mut base = me_segs.clone();
            let mut after = here;
            while let Some(a) = after.strip_prefix("super::") {
                base.pop();
                after = a;
            }
            (base, after)
        } else {
            (Vec::new(), "")
        };
        if after.is_empty() {
            continue;
        }
        for path in paths_after(after) {
            let mut full: Vec<&str> = base.clone();
            full.extend(path.iter().map(String::as_str));
            let target = (1..=full.len())
                .rev()
                .map(|n| full[..n].join("::"))
                .find(|m| known.contains(m));
            if let Some(t) = target {
                if t != me {
                    uses.insert(t);
                }
            }
        }
    }
    uses
}

/// Module path → the modules its code refers to.
fn module_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    modules(src, src, &mut files);
    let known: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    files
        .iter()
        .map(|(m, text)| (m.clone(), references(m, text, &known)))
        .collect()
}

/// The graph with every module folded onto its top-level module.
fn top_level(graph: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut out = Graph::new();
    for (from, uses) in graph {
        let entry = out.entry(top(from)).or_default();
        for to in uses {
            if top(to) != top(from) {
                entry.insert(top(to));
            }
        }
    }
    out
}

/// A cycle in the graph, as a path that starts and ends at one module.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &Graph,
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

/// A path of edges from `from` to `to`, if there is one.
fn path_between(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = vec![from.to_owned()];
    while let Some(n) = todo.pop() {
        for next in graph.get(&n).into_iter().flatten() {
            if next != from && !came_from.contains_key(next) {
                came_from.insert(next.clone(), n.clone());
                todo.push(next.clone());
            }
        }
    }
    came_from.contains_key(to).then(|| {
        let mut path = vec![to.to_owned()];
        while let Some(prev) = came_from.get(path.last().expect("non-empty")) {
            path.push(prev.clone());
            if prev == from {
                break;
            }
        }
        path.reverse();
        path
    })
}

fn server_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    for m in [
        "connection",
        "connection::handshake",
        "http",
        "http::queues",
    ] {
        assert!(
            graph.contains_key(m),
            "read the server's modules: {graph:?}"
        );
    }
    graph
}

#[test]
fn server_modules_and_submodules_form_no_circle() {
    if let Some(cycle) = find_cycle(&server_graph()) {
        panic!(
            "server modules import each other in a circle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn server_top_level_modules_form_no_circle() {
    if let Some(cycle) = find_cycle(&top_level(&server_graph())) {
        panic!(
            "server modules import each other in a circle (submodules folded \
             onto their top-level module): {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn connection_never_reaches_http() {
    let graph = top_level(&server_graph());
    if let Some(path) = path_between(&graph, "connection", "http") {
        panic!("the AMQP side reaches the HTTP side: {}", path.join(" -> "));
    }
}

#[test]
fn the_checker_sees_a_circle() {
    let mut g = Graph::new();
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
fn paths_resolve_to_the_deepest_module_they_name() {
    let known: BTreeSet<String> = ["connection", "http", "http::queues", "http::auth", "state"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let code = "use super::{auth::authenticate, HttpState};\n\
                use crate::state::Shared;\n\
                // crate::connection is a comment\n\
                let x = crate::ServerError::Startup;\n\
                let y = super::super::connection::serve();\n";
    assert_eq!(
        references("http::queues", code, &known),
        BTreeSet::from([
            "http".to_owned(),
            "http::auth".to_owned(),
            "state".to_owned(),
            "connection".to_owned(),
        ])
    );
}

#[test]
fn the_old_circle_through_connection_and_http_is_seen() {
    // The shape issue 15 found: `connection` used `crate::http::table_json`
    // while a handler under `http` used `crate::connection::Shared`.
    let known: BTreeSet<String> = ["connection", "http", "http::queues"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut g = Graph::new();
    for (m, code) in [
        ("connection", "let j = crate::http::table_json(&t);"),
        ("http", ""),
        ("http::queues", "use crate::connection::Shared;"),
    ] {
        g.insert(m.to_owned(), references(m, code, &known));
    }
    assert!(path_between(&top_level(&g), "connection", "http").is_some());
    assert!(find_cycle(&top_level(&g)).is_some());
}
