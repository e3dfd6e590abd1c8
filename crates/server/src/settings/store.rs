//! The settings of `[store]` and `[event_log]`: where and how data and
//! lifecycle events are kept. The store's tunables take their defaults
//! from the store itself ([`berth_store::StoreConfig::new`]).

use std::path::PathBuf;

use super::slot::{field, list, non_empty, one, switch, Refusal};
use super::Setting;
use crate::limits;

/// Where data goes when no directory is configured.
const DATA_DIR_DEFAULT: &str = "./berth-data";

/// The store's own defaults.
fn store() -> berth_store::StoreConfig {
    berth_store::StoreConfig::new(DATA_DIR_DEFAULT)
}

pub(super) static STORE: &[Setting] = &[
    Setting {
        key: "store.data_dirs",
        flag: "data-dir",
        value_name: "DIR",
        default_note: "",
        doc: "data directories (one per disk; log groups are spread over them); created if \
              missing and locked (`berth.lock`) so two brokers cannot share one. A changed \
              list (more directories, another order) is a reshape: see `store.reshape`.",
        slot: &list(field!(store.data_dirs), || {
            vec![PathBuf::from(DATA_DIR_DEFAULT)]
        })
        .check(|d| non_empty(d, "at least one directory is needed")),
    },
    Setting {
        key: "store.log_groups",
        flag: "log-groups",
        value_name: "N",
        default_note: "= one per core, 2–16",
        doc: "independent journals, each with its own files, writer thread and fsync; used \
              when a store is created; `0` keeps an existing store's count; another count \
              than the manifest's is a reshape (queue placement depends on it): see \
              `store.reshape`",
        slot: &one(field!(store.log_groups), || 0),
    },
    Setting {
        key: "store.sync",
        flag: "sync",
        value_name: "MODE",
        default_note: "",
        doc: "when a confirm is sent: after `fdatasync` (`always`), after `write` with \
              `fdatasync` every `sync_interval_ms` (`interval`: survives a process crash, not \
              power loss), or after `write` with `fdatasync` only on segment seal and \
              shutdown (`never`). See [DURABILITY.md](DURABILITY.md).",
        slot: &one(field!(store.sync), || store().sync),
    },
    Setting {
        key: "store.sync_interval_ms",
        flag: "sync-interval-ms",
        value_name: "MS",
        default_note: "",
        doc: "fdatasync period under `sync = interval`",
        slot: &one(field!(store.sync_interval_ms), || store().sync_interval_ms),
    },
    Setting {
        key: "store.queue_resident_messages_max",
        flag: "queue-resident-messages-max",
        value_name: "N",
        default_note: "",
        doc: "ready messages per queue whose bodies stay in memory; bodies beyond it are \
              dropped from memory once written to the store (persistent messages of durable \
              queues as stored; others as paging copies, dropped at restart) and read back on \
              delivery (0 = page out everything)",
        slot: &one(field!(store.queue_resident_messages_max), || {
            berth_broker::limits::RESIDENT_MESSAGES_MAX_DEFAULT
        }),
    },
    Setting {
        key: "store.queue_resident_bytes_max",
        flag: "queue-resident-bytes-max",
        value_name: "BYTES",
        default_note: "",
        doc: "body bytes per queue that stay in memory, whatever \
              `queue_resident_messages_max` allows: a queue of large messages pages out \
              sooner, so a backlog does not hold memory (0 = page out everything)",
        slot: &one(field!(store.queue_resident_bytes_max), || {
            berth_broker::limits::RESIDENT_BYTES_MAX_DEFAULT
        }),
    },
    Setting {
        key: "store.commit_delay_us_max",
        flag: "commit-delay-us-max",
        value_name: "US",
        default_note: "",
        doc: "cap on group commit's extra gathering pause, taken only when several committers \
              are active (a lone committer never waits); at most 5000",
        slot: &one(field!(store.commit_delay_us_max), || {
            store().commit_delay_us_max
        }),
    },
    Setting {
        key: "store.segment_size_bytes",
        flag: "segment-size-bytes",
        value_name: "BYTES",
        default_note: "64 MiB",
        doc: "journal segment size; a change applies to segments started afterwards \
              (segments of any size are read), and a reshape writes its copy with it",
        slot: &one(field!(store.segment_size_bytes), || {
            store().segment_size_bytes
        }),
    },
    Setting {
        key: "store.segment_prepare",
        flag: "segment-prepare",
        value_name: "BOOL",
        default_note: "",
        doc: "while a log group's fdatasyncs are small (at most 64 KiB on average: confirmed \
              publishers waiting one by one), a helper thread writes its next segment ahead \
              (zeros, fdatasynced) so that an fdatasync into it writes no inode; each such \
              segment is written twice. `false` on storage where writing zeros costs space or \
              wear (thin-provisioned volumes, some flash). See [FORMAT.md](FORMAT.md) and \
              [DURABILITY.md](DURABILITY.md)",
        slot: &one(field!(store.segment_prepare), || store().segment_prepare),
    },
    Setting {
        key: "store.direct_appends",
        flag: "direct-appends",
        value_name: "BOOL",
        default_note: "",
        doc: "each log group appends to its active segment past the page cache (`O_DIRECT`) \
              where the file system allows it (not tmpfs): a batch goes from the writer's \
              buffer to the device instead of through freshly allocated cache pages, and the \
              fdatasync only has to flush. Messages read back from the journal (a consumer \
              behind the in-memory window) come past the page cache too, from the disk \
              straight into their bodies, and a prepared segment's zeros are written past it \
              too. `false` appends, prepares and reads through the page cache. \
              See [DURABILITY.md](DURABILITY.md)",
        slot: &one(field!(store.direct_appends), || store().direct_appends),
    },
    Setting {
        key: "store.segment_cache_bytes",
        flag: "segment-cache-bytes",
        value_name: "BYTES",
        default_note: "256 MiB",
        doc: "bytes of each log group's newest journal left to the page cache: a sealed \
              segment that this many bytes were written after, and that no checkpoint still \
              reads, is dropped from the cache (`posix_fadvise(DONTNEED)`), so a deep backlog \
              does not keep taking memory and new writes reuse the pages dropped; a consumer \
              further behind reads its messages from the disk. 0 = never drop (the kernel \
              decides). See [OPERATIONS.md](OPERATIONS.md#the-page-cache)",
        slot: &one(field!(store.segment_cache_bytes), || {
            store().segment_cache_bytes
        }),
    },
    Setting {
        key: "store.accept_missing_segments",
        flag: "accept-missing-segments",
        value_name: "",
        default_note: "",
        doc: "a segment file that should hold live messages is missing: by default berth \
              refuses to start and names the file (restore it from a backup); `true` starts \
              anyway, dropping those messages and listing them in the log. See \
              [FORMAT.md](FORMAT.md)'s recovery decision table.",
        slot: &switch(field!(store.accept_missing_segments)),
    },
    Setting {
        key: "store.reshape",
        flag: "reshape",
        value_name: "",
        default_note: "",
        doc: "when the store on disk has another `log_groups` or set of `data_dirs` than \
              configured, rewrite it to the configured shape at startup (copy, verify, switch; \
              the old store is kept in `reshape-old-<unix_s>/`; needs about the store's size \
              free, checked first). Off: such a store refuses to start with a message saying \
              what would change and the disk needed. See \
              [OPERATIONS.md](OPERATIONS.md#reshaping-a-store).",
        slot: &switch(field!(store.reshape)),
    },
    Setting {
        key: "store.checkpoint_journal_bytes",
        flag: "checkpoint-journal-bytes",
        value_name: "BYTES",
        default_note: "64 MiB",
        doc: "journal bytes a log group writes between two checkpoints of its index (also \
              taken every 30 s); smaller means a shorter replay at restart and earlier space \
              reclamation, for more checkpoint writes (min 65536)",
        slot: &one(field!(store.checkpoint_journal_bytes), || {
            store().checkpoint_journal_bytes
        })
        .check(|b| {
            if *b < limits::CHECKPOINT_JOURNAL_BYTES_MIN {
                return Err(Refusal::new(
                    b.to_string(),
                    "must be at least 65536 (a checkpoint per few records would do nothing but \
                     checkpoint)",
                ));
            }
            Ok(())
        }),
    },
];

pub(super) static EVENT_LOG: &[Setting] = &[
    Setting {
        key: "event_log.enabled",
        flag: "event-log-enabled",
        value_name: "BOOL",
        default_note: "",
        doc: "record message lifecycle events (published, delivered, acked, requeued, \
              rejected, dead-lettered, expired, dropped) in per-log-group event files; read \
              them with `berth events` (see \
              [OPERATIONS.md](OPERATIONS.md#event-log-and-berth-events))",
        slot: &one(field!(event_log.enabled), || false),
    },
    Setting {
        key: "event_log.merge_interval_s",
        flag: "event-log-merge-interval-s",
        value_name: "S",
        default_note: "never",
        doc: "every S seconds, merge the groups' new events into one time-ordered combined \
              log (`events-merged-*.log` in the first data directory); it lags the group \
              files by at most S seconds",
        slot: &one(field!(event_log.merge_interval_s), || 0),
    },
    Setting {
        key: "event_log.file_bytes_max",
        flag: "event-log-file-bytes-max",
        value_name: "BYTES",
        default_note: "16 MiB",
        doc: "an event file is sealed (fdatasync'ed) and a new one begun before it would \
              exceed this (min 8264: two records of the largest size)",
        slot: &one(field!(event_log.file_bytes_max), || 16 * 1024 * 1024),
    },
    Setting {
        key: "event_log.retained_bytes_max",
        flag: "event-log-retained-bytes-max",
        value_name: "BYTES",
        default_note: "256 MiB",
        doc: "per group (and for the combined log): the oldest sealed event files are removed \
              while the files together exceed this (at least `file_bytes_max`)",
        slot: &one(field!(event_log.retained_bytes_max), || 256 * 1024 * 1024),
    },
    Setting {
        key: "event_log.retention_s",
        flag: "event-log-retention-s",
        value_name: "S",
        default_note: "7 days",
        doc: "sealed event files last written longer ago than this are removed (checked when \
              the group next writes events); 0 = no age limit",
        slot: &one(field!(event_log.retention_s), || 7 * 24 * 3600),
    },
    Setting {
        key: "event_log.buffer_bytes_max",
        flag: "event-log-buffer-bytes-max",
        value_name: "BYTES",
        default_note: "4 MiB",
        doc: "events not yet written, per group; if a group's event writer falls this far \
              behind, further events are dropped (counted, and logged at most once a second) \
              rather than slow publishers down. At most half of `file_bytes_max`.",
        slot: &one(field!(event_log.buffer_bytes_max), || 4 * 1024 * 1024),
    },
];
