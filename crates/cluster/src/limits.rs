//! Every limit of the replication layer, with its unit, in one place.

/// Largest encoded Raft entry, and so largest frame of `raft.log`: above
/// the largest single command (one message: a store record of at most
/// 129 MiB, plus its command header), which an entry may hold alone.
/// A `raft.log` frame claiming more is damage.
pub const ENTRY_BYTES_MAX_HARD: usize = 160 * 1024 * 1024;

/// Largest frame an authenticated peer may send another (an append, or a
/// snapshot chunk): one largest entry and the request around it. An append
/// that would encode larger is sent with fewer entries (openraft's
/// `PayloadTooLarge` hint). Larger frames close the connection.
pub const PEER_FRAME_BYTES_MAX: usize = ENTRY_BYTES_MAX_HARD + 1024 * 1024;

/// An append larger than this (encoded) is sent with fewer entries.
/// openraft gives an append one heartbeat interval (200 ms at berth's
/// default election timeout) to be received and fdatasynced; a follower
/// behind by many multi-MB entries must be sent them a few MB at a time,
/// or every try times out and it never catches up.
pub const APPEND_BYTES_TARGET: usize = 4 * 1024 * 1024;

/// Largest frame before a peer has proven the secret (handshake frames
/// are a few dozen bytes): a stranger cannot make a node allocate more.
pub const HANDSHAKE_FRAME_BYTES_MAX: usize = 4 * 1024;

/// A normal entry read back from the log's segments whose frame is at
/// least this large is handed out as where it lies (`types::Command`),
/// its command read again only when applied or sent: the ranges openraft
/// reads at once (a start applies the whole log since the last snapshot
/// in one batch) then hold log ids, not bodies. Smaller ones are read
/// whole (a second read would cost more than they hold).
pub const LOG_READ_LATER_BYTES_MIN: u64 = 64 * 1024;

/// Entries per append request; with berth's one-entry-per-fsync-batch rule a
/// request carries at most this many batches.
pub const APPEND_ENTRIES_MAX: u64 = 64;

/// Snapshot chunk size sent per install-snapshot request: the most of a
/// snapshot a leader or a follower holds in memory while it streams.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 * 1024 * 1024;

/// How long one snapshot chunk may take to be answered. The last chunk's
/// answer waits for the follower to check the whole file's CRC and
/// restore it into its store (seconds for a backlog of gigabytes), so
/// this is far above openraft's 200 ms default; a follower that dies
/// mid-transfer costs only its own replication stream this long.
pub const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 120_000;

/// How long a connecting peer has to complete the secret handshake.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 3_000;

/// Cluster handshakes (TLS and secret) one member runs at once from one
/// remote address; a further connection from it is closed at once. A
/// member reconnects to a peer one connection at a time.
pub const PEER_HANDSHAKES_PER_ADDRESS_MAX: usize = 8;

/// Cluster handshakes one member runs at once in all.
pub const PEER_HANDSHAKES_MAX: usize = 64;

/// Bytes of the random challenge each side sends in the handshake.
pub const CHALLENGE_BYTES: usize = 32;

/// Shortest secret a cluster accepts (RabbitMQ's cookie is 20 characters).
pub const SECRET_BYTES_MIN: usize = 16;

/// A Raft log segment holding this many bytes is closed and the next
/// append starts a new one; purged entries leave the disk a whole segment
/// at a time.
pub const LOG_SEGMENT_BYTES: u64 = 32 * 1024 * 1024;

/// A snapshot is taken once the log since the last one holds this many
/// bytes (or twice the last snapshot's size, if larger: its cost is then
/// at most half the bytes it saves), whatever the number of entries:
/// entries since the last snapshot are held in memory.
pub const SNAPSHOT_AFTER_LOG_BYTES: u64 = 128 * 1024 * 1024;

/// The most log bytes kept between snapshots, however large the last
/// snapshot: the log since the last snapshot is held in memory, so this
/// bounds that memory whatever the backlog.
pub const SNAPSHOT_AFTER_LOG_BYTES_MAX: u64 = 512 * 1024 * 1024;

/// Entries kept behind a snapshot, so that a follower a little behind
/// catches up from the log rather than a whole snapshot; few, since they
/// are held in memory and may each be a large batch.
pub const ENTRIES_KEPT_BEHIND_SNAPSHOT: u64 = 32;

/// How often a node compares the log's bytes since the last snapshot with
/// [`SNAPSHOT_AFTER_LOG_BYTES`].
pub const SNAPSHOT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// Proposals gathered into one Raft entry, at most.
pub const PROPOSALS_PER_ENTRY_MAX: usize = 4_096;

/// Bytes of proposals gathered into one Raft entry: gathering stops once a
/// batch reaches this size (one proposal may exceed it alone).
pub const ENTRY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Proposals waiting for the gatherer; a full queue makes `propose` wait.
pub const PROPOSALS_QUEUED_MAX: usize = 65_536;

/// How often a node looks at how long its running fdatasync has taken.
pub const DISK_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// When a leader's connection closes, its port is probed at these delays
/// (ms after the close): a dying process may still hold its listener for
/// a few milliseconds after its connections reset, so one probe can miss
/// the death and leave an election to the timeout.
pub const LEADER_PROBE_AT_MS: [u64; 4] = [0, 50, 150, 400];

/// How long one probe of a leader's port may take.
pub const LEADER_PROBE_TIMEOUT_MS: u64 = 200;

/// After the leader died, survivors stand again this long times (their
/// rank by id + 1) times the round if no leader emerged (see
/// `transport::server::elect_after_leader_died`)…
pub const LEADER_DEATH_RETRY_MS: u64 = 100;
/// …at most this many times; then the election timeout takes over.
pub const ELECTION_RETRIES: u64 = 2;

/// How often a member tries to meet the members whose member id it has
/// not learned yet (then once a second, to notice departures).
pub const MEET_RETRY_MS: u64 = 100;

/// How often a leader asks every member for its report (`report.rs`).
pub const REPORT_INTERVAL_MS: u64 = 1_000;

/// A member's report is shown for this long after it was heard.
pub const REPORT_FRESH_MS: u64 = 5_000;

/// How long `add-node` waits for a new member to catch up before it makes
/// it a voter (it stays a learner past that, and the call says so).
pub const LEARNER_CATCH_UP_MS: u64 = 120_000;

/// The newest bytes of a member's Raft log kept in memory once durable;
/// older entries are read back from the log's segments (`log_reader.rs`).
pub const LOG_RESIDENT_BYTES_MAX: u64 = 64 * 1024 * 1024;
