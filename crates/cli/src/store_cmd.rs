//! `berth store scan|verify ...`: the operator's look inside a store, on a
//! running broker's directories or offline. Read-only: these commands open
//! every file for reading only and never repair anything (recovery, at the
//! broker's next start, does that).
//!
//! Exit codes scripts can trust: 0 = read and (for verify) no problem;
//! 1 = verify found problems; 2 = the store could not be read at all (bad
//! arguments, not a store, I/O error).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use berth_store::advice::{self, Advice};
use berth_store::inspect::{inspect_group, GroupReport, Layout, Problem};
use berth_store::storage::OsStorage;
use berth_store::QueueId;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::exit::{EXIT_PROBLEMS, EXIT_UNREADABLE};

#[derive(Args, Debug)]
pub struct StoreArgs {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Per group and segment: live/dead bytes and records, the
    /// message-size histogram, queues by bytes, restart cost, and
    /// recommendations with their reasoning.
    Scan(ReadArgs),
    /// Check every record's checksum, every index reference and every
    /// checkpoint against the journal; exit 1 on any problem.
    Verify(ReadArgs),
    /// Copy the whole store (running or stopped) into a new directory,
    /// with a manifest of its parameters and every file's checksum.
    Backup(crate::backup_cmd::BackupArgs),
    /// Restore a backup into new or empty data directories (any number).
    Restore(crate::backup_cmd::RestoreArgs),
    /// Reclaim now (offline): move live records out of mostly-dead
    /// segments and delete them; report the bytes freed.
    Compact(crate::compact_cmd::CompactArgs),
}

#[derive(Args, Debug)]
struct ReadArgs {
    /// A data directory of the store (repeat for each, in any order).
    #[arg(long = "data-dir", value_name = "DIR", required = true)]
    data_dir: Vec<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Queues to list in the scan, largest first.
    #[arg(long, value_name = "N", default_value_t = 20)]
    top_queues: usize,
}

pub fn run(args: StoreArgs) -> ExitCode {
    match args.command {
        StoreCommand::Scan(a) => read_command(&a, false),
        StoreCommand::Verify(a) => read_command(&a, true),
        StoreCommand::Backup(a) => crate::backup_cmd::backup(&a),
        StoreCommand::Restore(a) => crate::backup_cmd::restore(&a),
        StoreCommand::Compact(a) => crate::compact_cmd::compact(&a),
    }
}

/// Everything read from a store.
struct Scanned {
    layout: Layout,
    groups: Vec<GroupReport>,
}

/// Reads every group with a progress bar on a terminal.
pub(crate) fn scan_store(dirs: &[PathBuf]) -> Result<(Layout, Vec<GroupReport>), String> {
    let storage = OsStorage;
    let layout = Layout::open(&storage, dirs).map_err(|e| e.to_string())?;
    let total: u64 = (0..layout.manifest.group_count)
        .map(|g| dir_bytes(&layout.group_dir(g)))
        .sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut groups = Vec::new();
    for g in 0..layout.manifest.group_count {
        bar.set_message(format!("group {g}"));
        let rep =
            inspect_group(&storage, &layout, g, &|n| bar.inc(n)).map_err(|e| e.to_string())?;
        groups.push(rep);
    }
    bar.finish_and_clear();
    Ok((layout, groups))
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn read_command(a: &ReadArgs, verify: bool) -> ExitCode {
    let what = if verify { "verify" } else { "scan" };
    let (layout, groups) = match scan_store(&a.data_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("berth store {what}: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    let s = Scanned { layout, groups };
    let problems: usize = s.groups.iter().map(|g| g.problems.len()).sum();
    if a.json {
        let v = if verify {
            verify_json(&s)
        } else {
            scan_json(&s, a.top_queues)
        };
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else if verify {
        print_verify(&s);
    } else {
        print_scan(&s, a.top_queues);
    }
    if verify && problems > 0 {
        ExitCode::from(EXIT_PROBLEMS)
    } else {
        ExitCode::SUCCESS
    }
}

/// Store id → (vhost, name, what), from the broker's definitions: a
/// queue's id, or a durable delayed exchange's (its pending messages,
/// docs/DELAYED.md).
type Names = std::collections::HashMap<u64, (String, String, &'static str)>;

fn queue_names(groups: &[GroupReport]) -> Names {
    let mut names = Names::new();
    for g in groups {
        for (k, v) in &g.meta {
            let parts = berth_broker::durable::split_key(k);
            let what = match parts.first().map(String::as_str) {
                Some("q") => "queue",
                Some("x") => "delayed exchange",
                _ => continue,
            };
            if parts.len() == 3 {
                if let Some(id) = berth_broker::durable::queue_id_of(v) {
                    names.insert(id, (parts[1].clone(), parts[2].clone(), what));
                }
            }
        }
    }
    names
}

fn queue_label(names: &Names, q: QueueId) -> String {
    const PAGING_BIT: u64 = 1 << 63;
    match names.get(&(q.0 & !PAGING_BIT)) {
        Some((vhost, name, "queue")) if q.0 & PAGING_BIT == 0 => {
            format!("'{name}' in vhost '{vhost}'")
        }
        Some((vhost, name, what)) if q.0 & PAGING_BIT == 0 => {
            format!("{what} '{name}' in vhost '{vhost}'")
        }
        Some((vhost, name, _)) => format!("paging copies of '{name}' in vhost '{vhost}'"),
        None => format!("queue id {} (no durable definition)", q.0),
    }
}

fn age_s(path: &Path) -> Option<u64> {
    let m = std::fs::metadata(path).ok()?.modified().ok()?;
    SystemTime::now()
        .duration_since(m)
        .ok()
        .map(|d| d.as_secs())
}

fn checkpoint_path(g: &GroupReport) -> Option<&Path> {
    let used = g.checkpoint_used?;
    g.checkpoints
        .iter()
        .find(|c| c.no == used)
        .map(|c| c.path.as_path())
}

fn problem_json(p: &Problem) -> Value {
    json!({"file": p.file, "offset": p.offset, "problem": p.what})
}

fn advice_of(s: &Scanned) -> Vec<Advice> {
    advice::advise(
        &s.groups,
        s.layout.manifest.group_count,
        s.layout.manifest.dir_count,
    )
}

fn queues_by_bytes(s: &Scanned) -> Vec<(QueueId, u32, berth_store::inspect::QueueReport)> {
    let mut v: Vec<_> = s
        .groups
        .iter()
        .flat_map(|g| g.queues.iter().map(|(q, r)| (*q, g.group, *r)))
        .collect();
    v.sort_by(|a, b| b.2.bytes.cmp(&a.2.bytes).then(a.0.cmp(&b.0)));
    v
}

fn scan_json(s: &Scanned, top: usize) -> Value {
    let names = queue_names(&s.groups);
    let mut sizes = berth_store::inspect::Histogram::default();
    for g in &s.groups {
        sizes.merge(&g.sizes);
    }
    let groups: Vec<Value> = s
        .groups
        .iter()
        .map(|g| {
            json!({
                "group": g.group,
                "dir": g.dir,
                "live_messages": g.live_messages,
                "live_payload_bytes": g.live_payload_bytes,
                "checkpoint": g.checkpoint_used,
                "checkpoint_age_s": checkpoint_path(g).and_then(age_s),
                "replay_records": g.replay_records,
                "replay_bytes": g.replay_bytes,
                "last_lsn": g.last_lsn,
                "segments": g.segments.iter().map(|sg| json!({
                    "file": sg.path,
                    "seq": sg.seq,
                    "bytes": sg.bytes,
                    "records": sg.records,
                    "publishes": sg.publishes,
                    "live_messages": sg.live_messages,
                    "live_bytes": sg.live_bytes,
                    "dead_bytes": sg.dead_bytes,
                })).collect::<Vec<_>>(),
                "problems": g.problems.iter().map(problem_json).collect::<Vec<_>>(),
                "notes": g.notes.iter().map(problem_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "data_dirs": s.layout.dirs,
        "manifest_version": s.layout.manifest_version,
        "store_id": format!("{:016x}", s.layout.manifest.store_id),
        "log_groups": s.layout.manifest.group_count,
        "groups": groups,
        "message_sizes": {
            "count": sizes.count,
            "sum_bytes": sizes.sum,
            "max_bytes": sizes.max,
            "buckets": sizes.buckets.iter().map(|(b, n)| json!({
                "from_bytes": if *b == 0 { 0 } else { 1u64 << b },
                "to_bytes": 1u64 << (b + 1),
                "count": n,
            })).collect::<Vec<_>>(),
        },
        "queues": queues_by_bytes(s).into_iter().take(top).map(|(q, g, r)| json!({
            "queue_id": q.0,
            "name": queue_label(&names, q),
            "group": g,
            "messages": r.messages,
            "bytes": r.bytes,
            "oldest_msg": r.oldest.map(|(m, _)| m.0),
            "oldest_segment": r.oldest.map(|(_, seg)| seg),
        })).collect::<Vec<_>>(),
        "streams": crate::stream_scan::streams(&s.layout, &s.groups).iter().map(|st| json!({
            "vhost": st.vhost,
            "name": st.name,
            "queue_id": st.queue_id,
            "messages": st.messages(),
            "bytes": st.bytes(),
            "segments": st.segments.iter().map(|sg| json!({
                "group": sg.group,
                "file": berth_store::segment::segment_name(sg.seq),
                "messages": sg.messages,
                "bytes": sg.bytes,
                "first_offset": sg.offsets.as_ref().ok().map(|o| o.0),
                "last_offset": sg.offsets.as_ref().ok().map(|o| o.1),
                "last_timestamp_ms": sg.last_timestamp_ms,
                "problem": sg.offsets.as_ref().err(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "recommendations": advice_of(s).into_iter().map(|a| json!({
            "topic": a.topic, "recommendation": a.recommendation, "reasoning": a.reasoning,
        })).collect::<Vec<_>>(),
        "problems": s.groups.iter().map(|g| g.problems.len()).sum::<usize>(),
    })
}

fn verify_json(s: &Scanned) -> Value {
    let problems: Vec<Value> = s
        .groups
        .iter()
        .flat_map(|g| g.problems.iter().map(problem_json))
        .collect();
    let records: u64 = s
        .groups
        .iter()
        .flat_map(|g| &g.segments)
        .map(|sg| sg.records)
        .sum();
    json!({
        "ok": problems.is_empty(),
        "groups": s.groups.len(),
        "segments": s.groups.iter().map(|g| g.segments.len()).sum::<usize>(),
        "checkpoints": s.groups.iter().map(|g| g.checkpoints.len()).sum::<usize>(),
        "records": records,
        "live_messages": s.groups.iter().map(|g| g.live_messages).sum::<u64>(),
        "problems": problems,
        "notes": s.groups.iter().flat_map(|g| g.notes.iter().map(problem_json)).collect::<Vec<_>>(),
        "unsalted": s.layout.unsalted_note().is_some(),
    })
}

use berth_store::advice::human_bytes as human;

fn print_scan(s: &Scanned, top: usize) {
    let m = &s.layout.manifest;
    println!(
        "store {:016x}: {} log groups in {} data director{} (manifest version {})",
        m.store_id,
        m.group_count,
        m.dir_count,
        if m.dir_count == 1 { "y" } else { "ies" },
        s.layout.manifest_version
    );
    for g in &s.groups {
        let bytes: u64 = g.segments.iter().map(|sg| sg.bytes).sum();
        let dead: u64 = g.segments.iter().map(|sg| sg.dead_bytes).sum();
        let ck = match (g.checkpoint_used, checkpoint_path(g).and_then(age_s)) {
            (Some(n), Some(age)) => format!("checkpoint #{n}, {age} s old"),
            (Some(n), None) => format!("checkpoint #{n}"),
            (None, _) => "no checkpoint".into(),
        };
        println!(
            "\ngroup {} ({}): {} segment(s), {}; live {} message(s), {} payload; dead {}",
            g.group,
            g.dir.display(),
            g.segments.len(),
            human(bytes),
            g.live_messages,
            human(g.live_payload_bytes),
            human(dead)
        );
        println!(
            "  {ck}; restart replays {} record(s), {} (lsn {})",
            g.replay_records,
            human(g.replay_bytes),
            g.last_lsn
        );
        for sg in &g.segments {
            println!(
                "  {:<16} {:>10}  {:>7} records  live {:>6} msgs {:>10}  dead {:>10}",
                sg.path
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
                human(sg.bytes),
                sg.records,
                sg.live_messages,
                human(sg.live_bytes),
                human(sg.dead_bytes)
            );
        }
    }
    let mut sizes = berth_store::inspect::Histogram::default();
    for g in &s.groups {
        sizes.merge(&g.sizes);
    }
    println!(
        "\nmessage sizes (payload bytes of the {} publish record(s) in the journal):",
        sizes.count
    );
    let widest = sizes.buckets.values().copied().max().unwrap_or(1).max(1);
    for (b, n) in &sizes.buckets {
        let from = if *b == 0 { 0 } else { 1u64 << b };
        let bar = usize::try_from(n * 40 / widest).unwrap_or(40).max(1);
        println!(
            "  {:>10} .. {:<10} {:>9}  {}",
            human(from),
            human(1u64 << (b + 1)),
            n,
            "#".repeat(bar)
        );
    }
    let names = queue_names(&s.groups);
    let queues = queues_by_bytes(s);
    println!("\nqueues by bytes ({} with live messages):", queues.len());
    for (q, g, r) in queues.iter().take(top) {
        println!(
            "  {:<40} group {:>2}  {:>8} msgs  {:>10}  oldest m{} in segment {}",
            queue_label(&names, *q),
            g,
            r.messages,
            human(r.bytes),
            r.oldest.map_or(0, |(m, _)| m.0),
            r.oldest.map_or(0, |(_, seg)| seg)
        );
    }
    let streams = crate::stream_scan::streams(&s.layout, &s.groups);
    if !streams.is_empty() {
        println!("\nstreams ({}), by journal segment:", streams.len());
    }
    for st in &streams {
        println!(
            "  '{}' in vhost '{}': {} msgs, {} in {} segment(s)",
            st.name,
            st.vhost,
            st.messages(),
            human(st.bytes()),
            st.segments.len()
        );
        for sg in &st.segments {
            let offsets = match &sg.offsets {
                Ok((a, b)) => format!("offsets {a}..{b}"),
                Err(why) => format!("offsets unreadable: {why}"),
            };
            println!(
                "    group {:>2} {:<16} {:>8} msgs {:>10}  {offsets}  newest at {} ms",
                sg.group,
                berth_store::segment::segment_name(sg.seq),
                sg.messages,
                human(sg.bytes),
                sg.last_timestamp_ms.map_or("?".into(), |t| t.to_string())
            );
        }
    }
    println!("\nrecommendations:");
    for a in advice_of(s) {
        println!(
            "  {}: {}\n    because {}",
            a.topic, a.recommendation, a.reasoning
        );
    }
    let problems: Vec<&Problem> = s.groups.iter().flat_map(|g| &g.problems).collect();
    if problems.is_empty() {
        println!("\nproblems: none (berth store verify checks the same and exits non-zero on any)");
    } else {
        println!("\nproblems ({}):", problems.len());
        for p in problems {
            println!("  {} offset {}: {}", p.file.display(), p.offset, p.what);
        }
    }
}

fn print_verify(s: &Scanned) {
    let problems: Vec<&Problem> = s.groups.iter().flat_map(|g| &g.problems).collect();
    for p in &problems {
        println!("{} offset {}: {}", p.file.display(), p.offset, p.what);
    }
    for n in s.groups.iter().flat_map(|g| &g.notes) {
        eprintln!("note: {} offset {}: {}", n.file.display(), n.offset, n.what);
    }
    if let Some(note) = s.layout.unsalted_note() {
        eprintln!("note: {note}");
    }
    let records: u64 = s
        .groups
        .iter()
        .flat_map(|g| &g.segments)
        .map(|sg| sg.records)
        .sum();
    let segments: usize = s.groups.iter().map(|g| g.segments.len()).sum();
    let checkpoints: usize = s.groups.iter().map(|g| g.checkpoints.len()).sum();
    println!(
        "verify: {} problem(s) in {} group(s), {segments} segment(s), {checkpoints} checkpoint(s), {records} record(s)",
        problems.len(),
        s.groups.len()
    );
}
