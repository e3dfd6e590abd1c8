//! Every fixed bound and every configuration default of the server, with
//! its unit in its name.
//!
//! Invariants:
//! - Each number has exactly one home: this file. The settings table
//!   (`settings/`) takes its defaults from here (the store's from
//!   `berth_store::StoreConfig`, the queue paging window and the count
//!   limits from the broker); the connection and the accept loop take their
//!   fixed bounds from here.
//! - Every wait named here is finite, so no connection or shutdown step can
//!   hang on a silent peer (docs/ARCHITECTURE.md, invariant 3).

// ---- Connection timing and buffers (fixed) ----

/// How long a connection waits for the peer's `close-ok` after sending
/// `connection.close`, and then for its writer to flush the last frames.
pub const CLOSE_TIMEOUT_MS: u64 = 3_000;

/// How long, after answering the peer's `connection.close` with
/// `close-ok`, the connection keeps reading (and dropping) what the peer
/// still sends before closing the socket itself. RabbitMQ 3.10 waits 30 s
/// (measured), then resets.
pub const CLOSE_DRAIN_TIMEOUT_MS: u64 = 30_000;

/// How often a connection checks its channels for overdue acks (consumer
/// timeout), the peer for missed heartbeats and the memory alarm.
pub const CONNECTION_TICK_MS: u64 = 100;

/// Step by which a connection's read buffer grows.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The largest step: a connection whose reads fill all the room it gave
/// them (a publisher streaming faster than it is read, issue 20) doubles
/// its step up to this. Every step ends with a partial frame that must be
/// copied to the next buffer (the earlier one is still held by the bodies
/// read into it), so with 16 KB bodies a 64 KB step copied about one byte
/// in eight a second time. A read that leaves room goes back to
/// [`READ_CHUNK_BYTES`], so idle and slow connections keep small buffers.
pub const READ_CHUNK_BYTES_MAX: usize = 256 * 1024;

/// Free space in the read buffer below which it grows by
/// [`READ_CHUNK_BYTES`] before the next read.
pub const READ_FREE_BYTES_MIN: usize = 4096;

/// Memory of a written output buffer that a busy connection keeps to
/// append its next frames to (instead of growing a fresh buffer from
/// nothing, copying it at every doubling); a larger one is freed, and an
/// idle connection keeps none. The buffer itself grows up to
/// `limits.connection_output_bytes_max` before consumers are paused.
pub const OUTPUT_BUFFER_KEPT_BYTES_MAX: usize = 256 * 1024;

/// Body frames at least this large go out from the message's own memory
/// (a slice of their own in the connection's vectored write) instead of
/// being copied into its output buffer (`pending_output.rs`). Smaller ones are
/// copied: less than a page is a cheap copy next to a slice of its own in
/// the write and a shared reference's atomic count. Not tuned: only 2 KB
/// (copied) and 16 KB (shared) bodies were measured (docs/BENCHMARKS.md,
/// "Bodies sent from the message's memory").
pub const SHARED_BODY_BYTES_MIN: usize = 4096;

/// Slices per vectored socket write (Linux's `UIO_MAXIOV`; more is
/// `EINVAL`).
pub const WRITE_SLICES_MAX: usize = 1024;

/// Unsent bytes the kernel keeps for one AMQP socket (`TCP_NOTSENT_LOWAT`):
/// beyond this a write waits for the peer to read. Without it the send
/// buffer grows to `net.ipv4.tcp_wmem`'s maximum (4 MiB here) in front of
/// a consumer that is behind, and every byte of it is latency (issue 20
/// goal 3: 4 MB in the send queue at 20,000 msg/s, half a second).
pub const SOCKET_UNSENT_BYTES_MAX: u32 = 128 * 1024;

/// Output a connection's queues may add while its writer waits for the
/// socket (the peer is not reading as fast as it is sent to), unless the
/// write in progress is larger (then as much as it): above this they hold
/// their messages, where flow control sees them, until the writer took
/// the buffer. A bound of one write's size keeps a fast consumer's next
/// write ready (16 KB drains lost a quarter of their rate at a fixed
/// 64 KiB) and gives a slow one no more than it drained. While the socket takes everything, only
/// `limits.connection_output_bytes_max` applies.
pub const OUTPUT_BEHIND_BLOCKED_SOCKET_BYTES_MAX: usize = 64 * 1024;

/// Requests queued behind a store writer's batch from which the writer
/// leaves the batch's publisher confirms to the connections' writer tasks
/// instead of sending them itself (`connection/awaiting_store.rs`): at least
/// this many means pipelined publishers, who wait for the writer's time.
/// Fanin's producers, one publish in flight each, queue fewer.
pub const ACKS_HANDED_BACK_QUEUED_MIN: usize = 64;

/// Journal completions pending for one connection (confirm-mode publishes
/// and `tx.commit` writes waiting for the journal) before the server stops
/// reading from it: back-pressure instead of unbounded bookkeeping and an
/// unbounded completion queue.
pub const COMPLETIONS_PER_CONNECTION_MAX: usize = 65_536;

/// Flow control, like RabbitMQ's credit flow: after a publish to a queue
/// whose consumers are busy but not keeping up, the connection stops reading
/// until they have caught up, checked this often ...
pub const FLOW_CHECK_MS: u64 = 1;

/// ... and reads again after this long in any case, so that acks on the
/// same connection get in.
pub const FLOW_PAUSE_MS_MAX: u64 = 100;

// ---- Server (fixed) ----

/// How often the timer service runs (message TTL expiry, `x-expires`).
pub const TIMER_TICK_MS: u64 = 10;

/// How long shutdown waits for connections to finish their close.
pub const SHUTDOWN_GRACE_MS: u64 = 5_000;

/// Extra time `Running::shutdown` gives the server task on top of
/// [`SHUTDOWN_GRACE_MS`] before giving up on it.
pub const SHUTDOWN_SLACK_MS: u64 = 1_000;

/// How often shutdown looks whether every connection has gone.
pub const SHUTDOWN_POLL_MS: u64 = 20;

/// Pause after a failed `accept` (EMFILE and friends), instead of spinning.
pub const ACCEPT_BACKOFF_MS: u64 = 100;

/// Connections the kernel queues for `accept` on a listener (`listen(2)`).
pub const LISTEN_BACKLOG_CONNECTIONS: i32 = 1024;

// ---- Configuration defaults (see docs/CONFIG.md) ----

/// `net.heartbeat_s`: the heartbeat the server proposes (RabbitMQ's).
pub const DEFAULT_HEARTBEAT_S: u16 = 60;

/// `net.handshake_timeout_ms` (RabbitMQ's).
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// `limits.frame_size_bytes_max` (RabbitMQ's `frame_max`).
pub const DEFAULT_FRAME_SIZE_BYTES_MAX: u32 = 131_072;

/// `limits.channels_per_connection_max` (RabbitMQ's `channel_max`).
pub const DEFAULT_CHANNELS_PER_CONNECTION_MAX: u16 = 2047;

/// `limits.message_size_bytes_max` (RabbitMQ's `max_message_size`).
pub const DEFAULT_MESSAGE_SIZE_BYTES_MAX: u64 = 128 * 1024 * 1024;

/// `limits.consumer_timeout_ms`: 30 minutes (RabbitMQ's).
pub const DEFAULT_CONSUMER_TIMEOUT_MS: u64 = 1_800_000;

/// `limits.connection_output_bytes_max`.
pub const DEFAULT_CONNECTION_OUTPUT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// `limits.memory_high_watermark_bytes = 0` means this share of the
/// machine's RAM, in tenths (RabbitMQ's default of 0.4).
pub const MEMORY_HIGH_WATERMARK_TENTHS_OF_RAM: u64 = 4;

/// RAM assumed when `/proc/meminfo` cannot be read.
pub const MEMORY_TOTAL_BYTES_FALLBACK: u64 = 4 << 30;

/// Smallest `store.checkpoint_journal_bytes` accepted: below it a group
/// would spend its time writing checkpoints.
pub const CHECKPOINT_JOURNAL_BYTES_MIN: u64 = 64 * 1024;
/// How long `POST /api/exchanges/{vhost}/{name}/publish` waits for the store
/// to confirm a persistent message before it answers 503.
pub const HTTP_PUBLISH_STORE_WAIT_MS: u64 = 10_000;
/// Message body bytes one `POST /api/queues/{vhost}/{name}/get` answer
/// carries at most (after `truncate`): the messages past it stay in the
/// queue. A first message larger than this still comes back, alone, so
/// every message can be read through the API.
pub const HTTP_GET_BODY_BYTES_MAX: usize = 16 << 20;
/// `limits.disk_free_bytes_min`: 50 MB, RabbitMQ's `disk_free_limit`
/// default.
pub const DEFAULT_DISK_FREE_BYTES_MIN: u64 = 50_000_000;

/// How often the disk free alarm measures free space (`statvfs`) on the
/// data directories' filesystems (RabbitMQ checks every 10 s at most; a
/// small filesystem fills faster, so more often).
pub const DISK_CHECK_MS: u64 = 250;
/// Longest a login attempt waits for its address's turn (`crate::throttle`);
/// an address whose turns are booked further ahead is refused without its
/// password being checked. Below `DEFAULT_HANDSHAKE_TIMEOUT_MS`, so an
/// AMQP client gets its answer before its handshake times out.
pub const LOGIN_WAIT_MS_MAX: u64 = 5_000;
/// Source addresses (IPv4 addresses, IPv6 /64s) the login throttle
/// remembers: its table has this many entries, 32 bytes each, allocated at
/// startup; a new address takes the place of the fullest bucket of its set.
/// A power of two.
pub const LOGIN_THROTTLE_ADDRESSES_MAX: usize = 8_192;
/// Default of `auth.login_failures_per_s_max`.
pub const DEFAULT_LOGIN_FAILURES_PER_S_MAX: u32 = 10;
/// TLS handshakes an HTTPS listener runs at once; beyond it, accepting
/// waits (the kernel's listen backlog holds the rest).
pub const HTTPS_HANDSHAKES_MAX: usize = 256;
/// TLS handshakes an HTTPS listener runs at once for one source address
/// (IPv4 address, IPv6 /64); a further connection from it is closed at
/// once, so idle sockets from one address cannot hold every slot. Above
/// the 6 connections a browser opens per host.
pub const HTTPS_HANDSHAKES_PER_ADDRESS_MAX: usize = 16;
/// `net.tls_handshake_timeout_ms`: a TLS handshake takes a few round
/// trips; a socket that has not finished one by then is closed.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 3_000;

/// Journal writes a cluster leader has handed to Raft and not yet seen
/// committed; past it connections stop being read until some commit.
pub const CLUSTER_WRITES_IN_FLIGHT_MAX: usize = 16_384;

/// How often a cluster member looks at its role (leader or not, lease
/// held, replica healthy).
pub const CLUSTER_ROLE_POLL_MS: u64 = 50;

/// A member whose Raft stopped (a failed log write) restarts no sooner
/// than this after the stop, and only once its disk has room.
pub const CLUSTER_RESTART_AFTER_STOP_MS: u64 = 2_000;

/// Free space a member whose Raft stopped waits for before it restarts
/// (or `limits.disk_free_bytes_min`, if larger): room for its log to grow.
pub const CLUSTER_RESTART_FREE_BYTES_MIN: u64 = 64 * 1024 * 1024;

/// How long a new leader waits for its announcement (the barrier behind
/// which every earlier committed entry is applied) before it tries again.
pub const CLUSTER_ANNOUNCE_TIMEOUT_MS: u64 = 5_000;

/// Worker threads of the runtime Raft runs on, apart from the broker's.
pub const RAFT_WORKER_THREADS: usize = 2;

/// A snapshot is written reading at most this many message bodies…
pub const SNAPSHOT_READ_COUNT_MAX: usize = 256;
/// …or at most this many bytes of them at a time (judged by the store's
/// index before reading; at least one body per read): with the snapshot
/// file's own 1 MiB buffer, what a snapshot build holds in memory beyond
/// the ids.
pub const SNAPSHOT_READ_BYTES_MAX: usize = 8 * 1024 * 1024;

/// How long a new leader waits for the rest of its process to let go of
/// the replica's store before it reopens it for the broker: a snapshot's
/// writer holds it for one read of at most [`SNAPSHOT_READ_BYTES_MAX`].
pub const REOPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest command a snapshot may hold: one message record (128 MiB body
/// and its header) with room to spare; a larger length is damage.
pub const SNAPSHOT_COMMAND_BYTES_MAX: usize = 160 * 1024 * 1024;

/// Bodies a member's replica hands its store ahead of the store's
/// writes: applying the Raft log it waits, past this many bytes not yet
/// written, until half are (a start applying hundreds of MB of log would
/// otherwise queue them all in memory: the store bounds its queue by
/// requests, not bytes); restoring a snapshot waits the same way.
pub const REPLICA_UNWRITTEN_BYTES_MAX: usize = 64 * 1024 * 1024;

// ---- MQTT (fixed; see docs/MQTT.md) ----

/// The largest packet a client may send before its CONNECT is accepted
/// (the CONNECT itself, will message included): RabbitMQ's
/// `mqtt.max_packet_size_unauthenticated` default.
pub const MQTT_CONNECT_BYTES_MAX: usize = 64 * 1024;

/// What an accepted client's packet may hold beyond its payload (topic
/// name up to 64 KiB, v5 properties): its packet limit is
/// `limits.message_size_bytes_max` plus this.
pub const MQTT_PACKET_HEADERS_BYTES_MAX: usize = 128 * 1024;

/// QoS 1 deliveries sent to one client and not yet PUBACKed (lower if a
/// v5 client's receive maximum says so): RabbitMQ's `mqtt.prefetch`
/// default.
pub const MQTT_DELIVERIES_UNACKED_MAX: u16 = 10;

/// QoS 1 PUBLISHes of one client whose PUBACK waits for the store before
/// the server stops reading from it (the receive maximum a v5 client is
/// told).
pub const MQTT_PUBLISHES_UNACKED_MAX: u16 = 1024;

/// How long a CONNECT waits for the connection that holds its client id
/// to close (session take-over).
pub const MQTT_TAKEOVER_WAIT_MS: u64 = 5_000;

/// A client's output buffer: above it queues hold deliveries back, above
/// twice it the client is not read.
pub const MQTT_OUTPUT_BYTES_MAX: usize = 1024 * 1024;

/// QoS 2 deliveries to one client PUBRECed and awaiting its PUBCOMP:
/// at this many, queues stop delivering to the client until one comes.
pub const MQTT_DELIVERIES_UNCOMPLETED_MAX: usize = 1024;

/// Topic aliases a 5.0 client may set (told in CONNACK as its topic
/// alias maximum); the server sends none.
pub const MQTT_TOPIC_ALIASES_MAX: u16 = 64;

/// Topics with a retained message in one vhost (MQTT retained messages
/// are held in memory as well as in the store: docs/MQTT.md).
pub const MQTT_RETAINED_MESSAGES_MAX: usize = 100_000;

/// Payload bytes of the retained messages of one vhost.
pub const MQTT_RETAINED_BYTES_MAX: usize = 256 * 1024 * 1024;

/// The longest client id: a session's queue name
/// (`mqtt-subscription-<id>qos1`) must fit AMQP's 255-byte short string.
pub const MQTT_CLIENT_ID_BYTES_MAX: usize = 255 - "mqtt-subscription-".len() - "qos1".len();

// ---- The stream protocol (fixed; see docs/STREAMS.md) ----

/// The largest frame a stream client may send before its Open succeeded
/// (peer properties, SASL): RabbitMQ's `stream.initial_frame_max` is
/// 8 KiB; berth allows a long password (a token) more room.
pub const STREAM_PROTO_INITIAL_FRAME_BYTES_MAX: u32 = 64 * 1024;

/// The frame_max berth proposes in Tune (RabbitMQ's default, 1 MiB); a
/// client may choose less, not more.
pub const STREAM_PROTO_FRAME_BYTES_MAX: u32 = 1024 * 1024;

/// The heartbeat berth proposes in Tune (RabbitMQ's default).
pub const STREAM_PROTO_HEARTBEAT_S: u32 = 60;

/// Messages a subscription can have taken from its stream and not yet
/// sent in a chunk (its broker prefetch): what waits while it has no
/// credit.
pub const STREAM_PROTO_DELIVERIES_PENDING_MAX: u16 = 2_000;

/// At most this many messages in one delivered chunk.
pub const STREAM_PROTO_CHUNK_MESSAGES_MAX: usize = 1_000;

/// A chunk stops taking messages at about this many bytes of them.
pub const STREAM_PROTO_CHUNK_BYTES_MAX: usize = 1024 * 1024;

/// Publishes of one connection whose confirm waits for the store before
/// the server stops reading from it.
pub const STREAM_PROTO_PUBLISHES_UNCONFIRMED_MAX: usize = 10_000;

/// A connection's output buffer: above it queues hold deliveries back,
/// above twice it the client is not read.
pub const STREAM_PROTO_OUTPUT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Publisher sequences (deduplication) reach the tracking file at most
/// this long after their confirm (stored offsets at once).
pub const STREAM_TRACKING_SAVE_MS: u64 = 1_000;

// ---- Shovels (shovel/, docs/SHOVELS.md) ----

/// `src-prefetch-count` when not given: unacknowledged messages a
/// shovel takes from its source (RabbitMQ's default).
pub const SHOVEL_PREFETCH_COUNT_DEFAULT: u16 = 1_000;

/// `reconnect-delay` when not given, in seconds: RabbitMQ 3.10's for
/// dynamic shovels (its static shovels wait 5 s).
pub const SHOVEL_RECONNECT_DELAY_S_DEFAULT: f64 = 1.0;

/// `reconnect_delay` of a static shovel when not given, in seconds
/// (RabbitMQ's for static shovels).
pub const SHOVEL_STATIC_RECONNECT_DELAY_S_DEFAULT: f64 = 5.0;

/// Consecutive failures double the wait before the next attempt, from
/// `reconnect-delay` up to this (or `reconnect-delay` if larger), so an
/// endpoint that is down for long is not hammered.
pub const SHOVEL_RECONNECT_DELAY_MS_MAX: u64 = 30_000;

/// A connection attempt to one URI (TCP, AMQP handshake, login, channel
/// and declarations) gives up after this, so a silent host counts as
/// a failure rather than a hang.
pub const SHOVEL_CONNECT_TIMEOUT_MS: u64 = 10_000;

/// A deleted or changed shovel closes its connections within this
/// (what it had not acknowledged goes back to its source queue).
pub const SHOVEL_CLOSE_TIMEOUT_MS: u64 = 3_000;
