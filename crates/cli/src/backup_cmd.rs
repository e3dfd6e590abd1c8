//! `berth store backup OUT` and `berth store restore OUT`: a whole store
//! copied with a manifest (format versions, log groups, segment size,
//! layout, broker version, every file's checksum), and restored into any
//! number of data directories with no hand-set parameter.
//!
//! A backup reads the data directories itself only while no broker runs
//! on them (it holds the broker's lock meanwhile); a running broker is
//! backed up with `--online`, through `POST /api/berth/store/backup`: the
//! broker pauses every log group for the cut, so the backup is one
//! instant of the whole store (a cut read from the files group by group
//! is not, and could miss a message dead-lettered between groups).
//!
//! Exit codes: 0 = done and verified; 1 = the backup or the restored store
//! does not verify (corrupt); 2 = refused or failed (bad arguments, a
//! non-empty target, a broker running on the directories without
//! `--online`, a format this build does not read, an I/O error).

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
    #[arg(
        long = "data-dir",
        value_name = "DIR",
        required_unless_present = "online"
    )]
    data_dir: Vec<PathBuf>,
    /// Ask the running broker to take the backup, through its HTTP API
    /// (--url, --username, --password); OUT is then a directory on the
    /// broker's machine.
    #[arg(long)]
    online: bool,
    #[command(flatten)]
    api: crate::admin::ApiArgs,
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

/// `--online`: the broker takes the backup.
fn backup_online(a: &BackupArgs) -> ExitCode {
    let out = match std::path::absolute(&a.out) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("berth store backup: {}: {e}", a.out.display());
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    let body = json!({ "dir": out });
    match a.api.call("POST", "/api/berth/store/backup", Some(&body)) {
        Err(e) => {
            eprintln!("berth store backup: {e}");
            ExitCode::from(EXIT_UNREADABLE)
        }
        Ok(v) => {
            let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            if a.json {
                println!("{v}");
            } else {
                println!(
                    "backup {} by the running broker: {} file(s), {} bytes, {} log groups; \
                     verified ({} bytes of a write in progress left out; writers paused {} us \
                     for the cut)",
                    out.display(),
                    n("files"),
                    n("bytes"),
                    n("log_groups"),
                    n("trimmed_bytes"),
                    n("pause_us")
                );
            }
            ExitCode::SUCCESS
        }
    }
}

pub fn backup(a: &BackupArgs) -> ExitCode {
    if a.online {
        return backup_online(a);
    }
    let storage = OsStorage;
    let layout = match Layout::open(&storage, &a.data_dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("berth store backup: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    // The broker's own lock, held for the whole copy: a broker running on
    // these directories keeps writing every group while they are read one
    // by one, so only it can take a cut consistent across groups.
    let _locks = match berth_server::lock_data_dirs(&a.data_dir) {
        Ok(l) => l,
        Err(berth_server::ServerError::DataDirLocked { path }) => {
            eprintln!(
                "berth store backup: a broker is running on {} (it holds berth.lock); back it up \
                 through it instead, so the cut is one instant of every log group: berth store \
                 backup {} --online --url http://HOST:PORT (its net.http_listen)",
                path.display(),
                a.out.display()
            );
            return ExitCode::from(EXIT_UNREADABLE);
        }
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
