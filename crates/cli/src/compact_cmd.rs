//! `berth store compact --data-dir D...`: reclaim now, offline. Opens the
//! store (recovery as at a broker start, under the data directories'
//! lock, so it refuses while a broker runs on them), moves the live
//! records out of every mostly-dead segment, writes two checkpoints so the
//! emptied segments lie behind both and are deleted, and reports the bytes
//! freed. A running broker does the same in the background.
//!
//! With `--online` it asks the running broker instead, through
//! `POST /api/berth/store/compact` (an administrator's credentials, as
//! `berth user` takes them), and prints what the broker freed.
//!
//! Exit codes: 0 = done; 2 = could not open or compact the store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use berth_store::{Store, StoreConfig};
use clap::Args;
use serde_json::json;

use crate::exit::EXIT_UNREADABLE;

#[derive(Args, Debug)]
pub struct CompactArgs {
    /// A data directory of the store (repeat for each, in the store's
    /// order as in store.data_dirs).
    #[arg(
        long = "data-dir",
        value_name = "DIR",
        required_unless_present = "online"
    )]
    data_dir: Vec<PathBuf>,
    /// Ask the running broker to compact now, through its HTTP API
    /// (--url, --username, --password), instead of opening the directories.
    #[arg(long)]
    online: bool,
    #[command(flatten)]
    api: crate::admin::ApiArgs,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

/// Bytes of the store's files (segments, checkpoints) under `dirs`.
fn store_bytes(dirs: &[PathBuf]) -> u64 {
    fn walk(d: &Path) -> u64 {
        std::fs::read_dir(d).map_or(0, |rd| {
            rd.filter_map(Result::ok)
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        })
    }
    dirs.iter().map(|d| walk(d)).sum()
}

pub fn compact(a: &CompactArgs) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("berth store compact: {e}");
        ExitCode::from(EXIT_UNREADABLE)
    };
    if a.online {
        return match a.api.call("POST", "/api/berth/store/compact", None) {
            Err(e) => fail(&e),
            Ok(v) => {
                let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                if a.json {
                    println!("{v}");
                } else {
                    println!(
                        "compacted {} log group(s) of the running broker: {} segment bytes before, {} after, {} freed",
                        n("groups"),
                        n("bytes_before"),
                        n("bytes_after"),
                        n("bytes_freed")
                    );
                }
                ExitCode::SUCCESS
            }
        };
    }
    for d in &a.data_dir {
        if !d.join(berth_store::manifest::MANIFEST_NAME).exists() {
            return fail(&format!(
                "{} holds no berth store (no MANIFEST)",
                d.display()
            ));
        }
    }
    // The broker's own lock: refused while a broker runs on these dirs.
    let _locks = match berth_server::lock_data_dirs(&a.data_dir) {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let before = store_bytes(&a.data_dir);
    let mut config = StoreConfig::new(a.data_dir[0].clone());
    config.data_dirs.clone_from(&a.data_dir);
    // The manifest's group count wins for an existing store.
    let (store, _recovered) = match Store::open(config) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let groups = store.group_count();
    let res = store
        .compact()
        .and_then(|()| store.checkpoint())
        .and_then(|()| store.checkpoint())
        .and_then(|()| store.close());
    if let Err(e) = res {
        return fail(&e);
    }
    let after = store_bytes(&a.data_dir);
    let freed = before.saturating_sub(after);
    if a.json {
        println!(
            "{}",
            json!({"groups": groups, "bytes_before": before, "bytes_after": after, "bytes_freed": freed})
        );
    } else {
        println!(
            "compacted {groups} log group(s): {before} bytes before, {after} after, {freed} freed"
        );
    }
    ExitCode::SUCCESS
}
