//! Server-side tracking for the stream protocol: consumer offsets
//! (StoreOffset / QueryOffset, by reference and stream) and the last
//! publishing id confirmed for each named publisher (deduplication and
//! QueryPublisherSequence), kept in one small file beside the store,
//! `<data_dirs[0]>/stream-tracking.json` (docs/FORMAT.md).
//!
//! RabbitMQ writes both into the stream itself (osiris tracking chunks),
//! so they are replicated with it; berth's file is local to the node:
//! in a cluster they are not replicated yet (docs/STREAMS.md).
//!
//! Invariants:
//! - The file is replaced whole: written to a temporary file, fdatasynced,
//!   renamed over the old one and the directory synced, so a crash leaves
//!   the old or the new file, never a torn one.
//! - A StoreOffset is on disk before the next frame of its connection
//!   is read ([`Tracking::store_offset`] writes at once).
//! - A publishing id is noted only once its message is durable (its
//!   confirm is due); the file has it within `STREAM_TRACKING_SAVE_MS`,
//!   so after a crash in that window a re-sent message can be stored
//!   twice (at-least-once, as without deduplication).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::limits::STREAM_TRACKING_SAVE_MS;

const FILE_NAME: &str = "stream-tracking.json";

/// The file's contents.
#[derive(Default, Serialize, Deserialize)]
struct Saved {
    /// `[vhost, stream, reference, offset]`.
    offsets: Vec<(String, String, String, u64)>,
    /// `[vhost, stream, publisher reference, last publishing id]`.
    publishers: Vec<(String, String, String, u64)>,
}

type Key = (String, String, String);

#[derive(Default)]
struct Inner {
    offsets: BTreeMap<Key, u64>,
    publishers: BTreeMap<Key, u64>,
    dirty: bool,
    saved_at: Option<Instant>,
}

/// Offsets and publisher sequences of every stream of this node.
pub struct Tracking {
    dir: Option<PathBuf>,
    inner: Mutex<Inner>,
}

fn key(vhost: &str, stream: &str, reference: &str) -> Key {
    (vhost.to_owned(), stream.to_owned(), reference.to_owned())
}

impl Tracking {
    /// Loads the file in `dir` (none: kept in memory only, for tests).
    pub fn open(dir: Option<PathBuf>) -> Self {
        let mut inner = Inner::default();
        if let Some(d) = &dir {
            let path = d.join(FILE_NAME);
            match std::fs::read(&path) {
                Ok(bytes) => match serde_json::from_slice::<Saved>(&bytes) {
                    Ok(s) => {
                        for (v, st, r, o) in s.offsets {
                            inner.offsets.insert((v, st, r), o);
                        }
                        for (v, st, r, o) in s.publishers {
                            inner.publishers.insert((v, st, r), o);
                        }
                    }
                    Err(e) => tracing::error!(path = %path.display(), error = %e,
                        "stream tracking file unreadable: stored offsets and publisher sequences start empty"),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "stream tracking file not read")
                }
            }
        }
        Self {
            dir,
            inner: Mutex::new(inner),
        }
    }

    pub fn offset(&self, vhost: &str, stream: &str, reference: &str) -> Option<u64> {
        (self.inner.lock().offsets)
            .get(&key(vhost, stream, reference))
            .copied()
    }

    /// StoreOffset: kept, and on disk before this returns.
    pub fn store_offset(&self, vhost: &str, stream: &str, reference: &str, offset: u64) {
        let mut g = self.inner.lock();
        g.offsets.insert(key(vhost, stream, reference), offset);
        g.dirty = true;
        self.save_locked(&mut g);
    }

    pub fn publisher_sequence(&self, vhost: &str, stream: &str, reference: &str) -> Option<u64> {
        (self.inner.lock().publishers)
            .get(&key(vhost, stream, reference))
            .copied()
    }

    /// A named publisher's message `id` is durable.
    pub fn confirmed(&self, vhost: &str, stream: &str, reference: &str, id: u64) {
        let mut g = self.inner.lock();
        let k = key(vhost, stream, reference);
        if g.publishers.get(&k).is_none_or(|last| *last < id) {
            g.publishers.insert(k, id);
            g.dirty = true;
        }
    }

    /// A stream was deleted: its tracking goes with it.
    pub fn forget_stream(&self, vhost: &str, stream: &str) {
        let mut g = self.inner.lock();
        g.offsets
            .retain(|(v, s, _), _| !(v == vhost && s == stream));
        g.publishers
            .retain(|(v, s, _), _| !(v == vhost && s == stream));
        g.dirty = true;
        self.save_locked(&mut g);
    }

    /// Saves if something changed and the last save is
    /// `STREAM_TRACKING_SAVE_MS` old (or `now`).
    pub fn save_if_due(&self, now: bool) {
        let mut g = self.inner.lock();
        let due = g
            .saved_at
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(STREAM_TRACKING_SAVE_MS));
        if g.dirty && (due || now) {
            self.save_locked(&mut g);
        }
    }

    fn save_locked(&self, g: &mut Inner) {
        let Some(dir) = &self.dir else {
            g.dirty = false;
            return;
        };
        let saved = Saved {
            offsets: (g.offsets.iter())
                .map(|((v, s, r), o)| (v.clone(), s.clone(), r.clone(), *o))
                .collect(),
            publishers: (g.publishers.iter())
                .map(|((v, s, r), o)| (v.clone(), s.clone(), r.clone(), *o))
                .collect(),
        };
        let write = || -> std::io::Result<()> {
            let tmp = dir.join(format!("{FILE_NAME}.tmp"));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec(&saved).unwrap_or_default())?;
            f.sync_data()?;
            std::fs::rename(&tmp, dir.join(FILE_NAME))?;
            std::fs::File::open(dir)?.sync_all()
        };
        // A write waits for the disk: off the async reactor, as the
        // journal's metadata writes are.
        let r = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
            .map_or_else(write, |_| tokio::task::block_in_place(write));
        match r {
            Ok(()) => {
                g.dirty = false;
                g.saved_at = Some(Instant::now());
            }
            Err(e) => tracing::error!(dir = %dir.display(), error = %e,
                "stream tracking not saved (stored offsets and publisher sequences stay in memory; retried)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_sequences_survive_a_reopen() {
        let dir = berth_testdir::TestDir::new("stream-tracking");
        let t = Tracking::open(Some(dir.path().to_path_buf()));
        t.store_offset("/", "s", "app", 41);
        t.confirmed("/", "s", "pub", 9);
        t.confirmed("/", "s", "pub", 7);
        t.save_if_due(true);
        let again = Tracking::open(Some(dir.path().to_path_buf()));
        assert_eq!(again.offset("/", "s", "app"), Some(41));
        assert_eq!(again.publisher_sequence("/", "s", "pub"), Some(9));
        again.forget_stream("/", "s");
        assert_eq!(
            Tracking::open(Some(dir.path().to_path_buf())).offset("/", "s", "app"),
            None
        );
    }
}
