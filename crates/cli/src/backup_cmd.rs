//! `berth store backup OUT` and `berth store restore OUT`: a whole store
//! copied with a manifest (format versions, log groups, segment size,
//! layout, broker version, every file's checksum), taken from a running
//! broker's directories or offline, and restored into any number of data
//! directories with no hand-set parameter.
//!
//! Exit codes: 0 = done and verified; 1 = the backup or the restored store
//! does not verify (corrupt); 2 = refused or failed (bad arguments, a
//! non-empty target, a format this build does not read, an I/O error).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use berth_store::backup::{self, BackupManifest};
use berth_store::inspect::{inspect_group, Layout};
use berth_store::storage::OsStorage;
use berth_store::StoreError;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::exit::{EXIT_PROBLEMS, EXIT_UNREADABLE};

#[derive(Args, Debug)]
pub struct BackupArgs {
    /// Directory to create the backup in (new or empty).
    #[arg(value_name = "OUT")]
    out: PathBuf,
    /// A data directory of the store (repeat for each, in any order).
    #[arg(long = "data-dir", value_name = "DIR", required = true)]
    data_dir: Vec<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// A backup directory written by `berth store backup`.
    #[arg(value_name = "BACKUP")]
    backup: PathBuf,
    /// Data directory to restore into (repeatable; new or empty; any
    /// number, not necessarily the backed-up store's).
    #[arg(long = "data-dir", value_name = "DIR", required = true)]
    data_dir: Vec<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

fn bar() -> ProgressBar {
    let b = ProgressBar::no_length();
    b.set_style(
        ProgressStyle::with_template("{msg} {bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    b
}

fn code_of(e: &StoreError) -> u8 {
    match e {
        StoreError::Corrupt { .. } => EXIT_PROBLEMS,
        _ => EXIT_UNREADABLE,
    }
}

pub fn backup(a: &BackupArgs) -> ExitCode {
    let storage = OsStorage;
    let layout = match Layout::open(&storage, &a.data_dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("berth store backup: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let b = bar();
    b.set_message("copying");
    let res = backup::backup(
        &storage,
        &layout,
        &a.out,
        env!("CARGO_PKG_VERSION"),
        now,
        &|n| b.inc(n),
    );
    b.finish_and_clear();
    match res {
        Ok(r) => {
            if a.json {
                println!(
                    "{}",
                    json!({
                        "backup": a.out,
                        "files": r.manifest.files.len(),
                        "bytes": r.bytes,
                        "trimmed_bytes": r.trimmed_bytes,
                        "log_groups": r.manifest.log_groups,
                        "source_data_dirs": r.manifest.source_data_dirs,
                        "segment_size_bytes": r.manifest.segment_size_bytes,
                    })
                );
            } else {
                println!(
                    "backup {}: {} file(s), {} bytes, {} log groups from {} data director{}; \
                     verified ({} bytes of a write in progress left out)",
                    a.out.display(),
                    r.manifest.files.len(),
                    r.bytes,
                    r.manifest.log_groups,
                    r.manifest.source_data_dirs,
                    if r.manifest.source_data_dirs == 1 {
                        "y"
                    } else {
                        "ies"
                    },
                    r.trimmed_bytes
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("berth store backup: {e}");
            ExitCode::from(code_of(&e))
        }
    }
}

pub fn restore(a: &RestoreArgs) -> ExitCode {
    let storage = OsStorage;
    let b = bar();
    b.set_message("restoring");
    let res = backup::restore(&storage, &a.backup, &a.data_dir, &|n| b.inc(n));
    b.finish_and_clear();
    let m: BackupManifest = match res {
        Ok(m) => m,
        Err(e) => {
            eprintln!("berth store restore: {e}");
            return ExitCode::from(code_of(&e));
        }
    };
    // The restored store must verify as a whole.
    let problems: Result<Vec<String>, StoreError> =
        Layout::open(&storage, &a.data_dir).and_then(|layout| {
            let mut v = Vec::new();
            for g in 0..layout.manifest.group_count {
                let rep = inspect_group(&storage, &layout, g, &|_| {})?;
                v.extend(
                    rep.problems
                        .iter()
                        .map(|p| format!("{} offset {}: {}", p.file.display(), p.offset, p.what)),
                );
            }
            Ok(v)
        });
    let problems = match problems {
        Ok(p) => p,
        Err(e) => {
            eprintln!("berth store restore: the restored store cannot be read: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    if a.json {
        println!(
            "{}",
            json!({
                "restored": a.data_dir,
                "log_groups": m.log_groups,
                "files": m.files.len(),
                "broker_version": m.broker_version,
                "problems": problems,
            })
        );
    } else {
        println!(
            "restored {} file(s), {} log groups (backup of berth {}) into {} data director{}",
            m.files.len(),
            m.log_groups,
            m.broker_version,
            a.data_dir.len(),
            if a.data_dir.len() == 1 { "y" } else { "ies" }
        );
        for p in &problems {
            println!("{p}");
        }
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("berth store restore: the restored store does not verify");
        ExitCode::from(EXIT_PROBLEMS)
    }
}
