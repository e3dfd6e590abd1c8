//! Opening the store: its manifests read (or written, for a new store),
//! every log group recovered on a thread of its own with progress logged,
//! what they found merged for the broker, and the group writers started.
//!
//! Invariants:
//! - Nothing is written before every manifest agrees (format, group
//!   count, which directory of the set each is); a mismatch is refused
//!   with the file named.
//! - A queue's messages from several groups are merged in id order, not
//!   sorted again.

use super::*;

impl Store {
    pub fn open(config: StoreConfig) -> Result<(Store, Recovered), StoreError> {
        Self::open_with(config, Arc::new(OsStorage))
    }

    /// Opens the store through `storage` (tests pass a fault-injecting one).
    pub fn open_with(
        config: StoreConfig,
        storage: Arc<dyn Storage>,
    ) -> Result<(Store, Recovered), StoreError> {
        Self::open_with_clock(config, storage, Arc::new(SystemClock))
    }

    /// Opens the store through `storage`, its writers reading time from
    /// `clock` (tests pass one they move by hand).
    pub fn open_with_clock(
        config: StoreConfig,
        storage: Arc<dyn Storage>,
        clock: Arc<dyn Clock>,
    ) -> Result<(Store, Recovered), StoreError> {
        config.validate()?;
        let started = Instant::now();
        let (group_count, salt) = open_manifests(&config, storage.as_ref())?;
        let dirs: Vec<PathBuf> = (0..group_count)
            .map(|g| manifest::group_dir(&config.data_dirs, g))
            .collect();
        let results = recover_groups(&config, storage.as_ref(), &dirs, salt, started);

        let mut recovered = Recovered {
            metadata: BTreeMap::new(),
            queues: BTreeMap::new(),
            streams: BTreeMap::new(),
            damage: Vec::new(),
            stats: RecoveryStats::default(),
            next_msg_id: MsgId(1),
        };
        let mut groups = Vec::with_capacity(results.len());
        let mut msg_id_hw = 0u64;
        let mut per_group = Vec::new();
        for (r, took) in results {
            per_group.push((r?, took));
        }
        for (g, (mut rec, recovery)) in per_group.into_iter().enumerate() {
            let g = u32::try_from(g).expect("validated");
            msg_id_hw = msg_id_hw.max(rec.index.msg_id_hw);
            recovered.add_group(&mut rec);
            let (tx, rx) = writer::inbox(config.channel_requests_max);
            let dir = &dirs[g as usize];
            let init = WriterInit {
                files: rec
                    .segments
                    .into_iter()
                    .map(|(s, f)| {
                        // Read past the page cache as the segments written
                        // from now on are (`StoreConfig::direct_appends`).
                        let file = if config.direct_appends {
                            storage.direct_reads(&crate::segment::segment_path(dir, s), f.file)
                        } else {
                            f.file
                        };
                        (s, (file, f.len))
                    })
                    .collect(),
                index: rec.index,
                next_seq: rec.next_seq,
                next_lsn: rec.next_lsn,
                checkpoints: rec.checkpoints,
                next_checkpoint_no: rec.next_checkpoint_no,
                index_from_journal: rec.index_from_journal,
                salt,
            };
            let (writer, shared) = Writer::new(
                g,
                dirs[g as usize].clone(),
                Arc::clone(&storage),
                config.clone(),
                rx,
                init,
                Arc::clone(&clock),
            );
            let thread = std::thread::Builder::new()
                .name(format!("berth-group-{g}"))
                .spawn(move || writer.run_contained())
                .map_err(|e| StoreError::io("spawn writer thread", &dirs[g as usize], e))?;
            groups.push(Group {
                recovery,
                tx,
                shared,
                thread: Some(thread),
            });
        }
        recovered.stats.groups = group_count;
        recovered.next_msg_id = MsgId(msg_id_hw + 1);
        recovered.stats.duration = started.elapsed();
        tracing::info!(
            groups = group_count,
            records = recovered.stats.records_replayed,
            bytes = recovered.stats.bytes_scanned,
            queues = recovered.queues.len(),
            damaged_ranges = recovered.damage.len(),
            ms = recovered.stats.duration.as_millis(),
            "store recovered"
        );
        Ok((
            Store {
                groups,
                next_msg_id: AtomicU64::new(msg_id_hw + 1),
                payload_bytes_max: config.payload_bytes_max,
                storage,
                data_dirs: config.data_dirs.clone(),
            },
            recovered,
        ))
    }
}

/// Recovers every group in parallel, one thread each, logging progress
/// every `recovery_progress_interval_ms`; each result with its duration.
fn recover_groups(
    config: &StoreConfig,
    storage: &dyn Storage,
    dirs: &[PathBuf],
    salt: u32,
    started: Instant,
) -> Vec<(Result<GroupRecovery, StoreError>, Duration)> {
    let progress = Progress::default();
    let group_count = u32::try_from(dirs.len()).expect("validated");
    std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(g, dir)| {
                let progress = &progress;
                let g = u32::try_from(g).expect("validated");
                std::thread::Builder::new()
                    .name(format!("berth-recover-{g}"))
                    .spawn_scoped(s, move || {
                        let started = Instant::now();
                        let r = recovery::recover_group(
                            storage,
                            g,
                            dir,
                            progress,
                            salt,
                            config.accept_missing_segments,
                        );
                        (r, started.elapsed())
                    })
                    .expect("spawn recovery thread")
            })
            .collect();
        let interval = Duration::from_millis(config.recovery_progress_interval_ms.max(1));
        let mut next_log = Instant::now() + interval;
        while handles.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5).min(interval));
            if Instant::now() >= next_log {
                log_progress(&progress, started, group_count);
                next_log += interval;
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("recovery thread panicked"))
            .collect()
    })
}

/// Two lists of messages in id order, as one in id order.
fn merge_by_id(a: Vec<RecoveredMessage>, b: Vec<RecoveredMessage>) -> Vec<RecoveredMessage> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.msg <= y.msg => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(m) => out.push(m),
            None => return out,
        }
    }
}

impl Recovered {
    /// Adds what one group's recovery found: its metadata, its live
    /// messages (per queue), its statistics and damage.
    fn add_group(&mut self, rec: &mut GroupRecovery) {
        for (k, v) in &rec.index.meta {
            self.metadata
                .insert(Bytes::copy_from_slice(k), Bytes::copy_from_slice(v));
        }
        self.streams.extend(streams::recovered_streams(&rec.index));
        // Each group's lists are in id order already (made by its
        // recovery thread); a queue with messages in several groups gets
        // them merged, not sorted.
        for (q, msgs) in std::mem::take(&mut rec.queues) {
            match self.queues.entry(q) {
                btree_map::Entry::Vacant(v) => {
                    v.insert(msgs);
                }
                btree_map::Entry::Occupied(mut o) => {
                    let mine = std::mem::take(o.get_mut());
                    *o.get_mut() = merge_by_id(mine, msgs);
                }
            }
        }
        let st = &mut self.stats;
        st.records_replayed += rec.records_replayed;
        st.bytes_scanned += rec.bytes_scanned;
        st.truncated_bytes += rec.truncated_bytes;
        st.checkpoints_used += u32::from(rec.checkpoint_used.is_some());
        st.checkpoints_ignored
            .extend(rec.checkpoints_ignored.iter().cloned());
        self.damage.extend(rec.damage.iter().cloned());
    }
}

fn log_progress(p: &Progress, started: Instant, groups: u32) {
    let done = p.bytes_done.load(Ordering::Relaxed);
    let total = p.bytes_total.load(Ordering::Relaxed).max(1);
    let elapsed = started.elapsed().as_secs_f64();
    let eta_s = if done == 0 {
        f64::NAN
    } else {
        elapsed * (total - done.min(total)) as f64 / done as f64
    };
    tracing::info!(
        groups,
        bytes_done = done,
        bytes_total = total,
        records = p.records.load(Ordering::Relaxed),
        eta_s = format!("{eta_s:.1}"),
        "recovering store"
    );
}

/// Reads or creates the manifests; returns the group count and the record
/// salt.
fn open_manifests(config: &StoreConfig, storage: &dyn Storage) -> Result<(u32, u32), StoreError> {
    let dir_count = u32::try_from(config.data_dirs.len())
        .map_err(|e| StoreError::Config(format!("too many data_dirs: {e}")))?;
    let mut found: Vec<Option<Manifest>> = Vec::new();
    let mut oldest_version = manifest::MANIFEST_VERSION;
    for dir in &config.data_dirs {
        storage
            .create_dir_all(dir)
            .map_err(|e| StoreError::io("create dir", dir, e))?;
        let names = storage
            .list(dir)
            .map_err(|e| StoreError::io("list", dir, e))?;
        if names.iter().any(|n| n == MANIFEST_NAME) {
            let path = dir.join(MANIFEST_NAME);
            let bytes = manifest::read_all(storage, &path)?;
            found.push(Some(Manifest::decode(&bytes, &path)?));
            oldest_version = oldest_version.min(manifest::version_of(&bytes));
        } else {
            found.push(None);
        }
    }
    let existing: Vec<&Manifest> = found.iter().flatten().collect();
    let Some(first) = existing.first() else {
        let store_id: u64 = rand::rng().random();
        // Secret from publishers (see record.rs); never 0, which means
        // "unsalted" (stores created before manifest version 2).
        let record_salt: u32 = rand::rng().random_range(1..=u32::MAX);
        manifest::create_group_dirs(storage, &config.data_dirs, config.log_groups)?;
        for (i, dir) in config.data_dirs.iter().enumerate() {
            let m = Manifest {
                group_count: config.log_groups,
                dir_count,
                dir_index: u32::try_from(i).expect("checked"),
                store_id,
                record_salt,
            };
            m.write(storage, dir)?;
        }
        tracing::info!(
            groups = config.log_groups,
            dirs = dir_count,
            "created new store"
        );
        return Ok((config.log_groups, record_salt));
    };
    for (i, (m, dir)) in found.iter().zip(&config.data_dirs).enumerate() {
        let ok = m.is_some_and(|m| {
            m.store_id == first.store_id
                && m.dir_count == dir_count
                && m.dir_index as usize == i
                && m.group_count == first.group_count
                && m.record_salt == first.record_salt
        });
        if !ok {
            return Err(StoreError::Config(format!(
                "{} does not hold data directory {i} of {dir_count} of this store (manifest: {m:?})",
                dir.display()
            )));
        }
    }
    if oldest_version < manifest::MANIFEST_VERSION {
        // Before anything is written: from here on payloads may carry
        // times, which a berth before them cannot read (manifest.rs).
        for (m, dir) in found.iter().flatten().zip(&config.data_dirs) {
            m.write(storage, dir)?;
        }
        tracing::info!(
            from = oldest_version,
            to = manifest::MANIFEST_VERSION,
            "store format upgraded (messages now carry their times); a berth before this version refuses the store"
        );
    }
    if first.group_count != config.log_groups {
        tracing::warn!(configured = config.log_groups, on_disk = first.group_count,
            "log_groups differs from the store's manifest; keeping the manifest's (queue placement depends on it)");
    }
    Ok((first.group_count, first.record_salt))
}
