//! Every limit and default of the broker core, with its unit in its name:
//! the one place to look a number up or change it.

/// Default of `store.queue_resident_messages_max`: ready messages per queue
/// whose bodies stay in memory; beyond it, bodies already written to the
/// journal are read back when needed.
pub const RESIDENT_MESSAGES_MAX_DEFAULT: usize = 4096;

/// Enqueues between two paging scans of a queue past its resident window.
pub const PAGE_SCAN_EVERY_MESSAGES: u64 = 64;

/// Paged-out messages read back together when a queue needs one.
pub const READ_AHEAD_MESSAGES: usize = 64;

/// Ready messages above which a queue whose consumers are busy counts as
/// backlogged: they are not keeping up, and publishers to it are slowed
/// down (flow control) so the backlog, and the latency it adds, stays
/// bounded. A queue whose consumers deliver nothing (all stuck at their
/// prefetch limit) is not backlogged: it grows, as in RabbitMQ.
pub const FLOW_READY_MAX: usize = 256;

/// A queue whose last delivery is older than this has no busy consumers.
pub const FLOW_ACTIVE_MS: u64 = 100;

/// Length of the random tail of a server-named queue (`amq.gen-…`), in
/// characters, as RabbitMQ names them.
pub const SERVER_NAMED_TAIL_CHARS: usize = 22;
