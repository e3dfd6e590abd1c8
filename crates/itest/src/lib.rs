//! Harness for black-box tests: starts the real `berth` binary (or points at
//! the broker named by `BERTH_TEST_URI`) and offers small helpers around lapin
//! so that each test reads as the behaviour it pins.
//!
//! Invariants:
//! - A broker started here never outlives its [`Broker`] value: `Drop` sends
//!   SIGTERM, waits briefly, then SIGKILLs, also while a test panics.
//! - No fixed ports: berth listens on port 0 and the harness reads the bound
//!   address from its `berth ready amqp=HOST:PORT` log line.
//! - Every name a test creates is unique ([`unique`]), so the suite can share
//!   one external broker (RabbitMQ, for reference runs) with other users.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use lapin;
use lapin::message::{BasicGetMessage, Delivery, DeliveryResult};
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ConsumerDelegate};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc as tmpsc;

/// Environment variable naming an already running broker to test instead of
/// starting berth (e.g. RabbitMQ, to check that the assertions are real
/// RabbitMQ behaviour).
pub const TEST_URI_ENV: &str = "BERTH_TEST_URI";
/// Environment variable overriding the path of the berth binary.
pub const BIN_ENV: &str = "BERTH_BIN";

/// When set, every checked reply code and text is printed (run with
/// `--nocapture` to list what a broker answers).
pub const SHOW_REPLIES_ENV: &str = "ITEST_SHOW_REPLIES";

/// Upper bound on one whole test; nothing in the suite may hang past it.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a test waits for something that should happen (a delivery, a
/// cancel notification) before calling it missing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a test waits to be convinced that something does *not* happen
/// (no further delivery past a prefetch limit).
pub const QUIET_PERIOD: Duration = Duration::from_millis(300);

const READY_MARKER: &str = "berth ready amqp=";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Lines of broker log kept for the failure report of a test.
const LOG_LINES_KEPT_MAX: usize = 400;

/// Runs a test body under [`TEST_TIMEOUT`], failing the test if it takes longer.
pub async fn within<F: Future<Output = ()>>(body: F) {
    if tokio::time::timeout(TEST_TIMEOUT, body).await.is_err() {
        panic!("test did not finish within {TEST_TIMEOUT:?}");
    }
}

/// Awaits `fut` for at most [`EVENT_TIMEOUT`], naming `what` if it takes longer.
#[track_caller]
pub fn bounded<F: Future>(what: &str, fut: F) -> impl Future<Output = F::Output> {
    let what = what.to_owned();
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(EVENT_TIMEOUT, fut).await {
            Ok(out) => out,
            Err(_) => panic!("{what}: no answer within {EVENT_TIMEOUT:?} (at {caller})"),
        }
    }
}

/// A name no other test (and no other run) uses: `prefix` plus process id,
/// a counter and the clock.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("itest.{prefix}.{}.{n}.{nanos:x}", std::process::id())
}

/// True when the suite runs against an external broker (`BERTH_TEST_URI`).
pub fn is_external() -> bool {
    std::env::var_os(TEST_URI_ENV).is_some_and(|v| !v.is_empty())
}

/// A broker under test: either a berth process owned by this value or the
/// external broker named by `BERTH_TEST_URI`.
pub struct Broker {
    uri: String,
    amqp_addr: String,
    process: Option<BrokerProcess>,
}

struct BrokerProcess {
    child: Child,
    data_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Broker {
    /// The broker for a test that needs no special settings.
    pub fn start() -> Broker {
        if is_external() {
            let uri = std::env::var(TEST_URI_ENV).expect("BERTH_TEST_URI is set");
            let amqp_addr = authority_of(&uri);
            return Broker {
                uri,
                amqp_addr,
                process: None,
            };
        }
        Self::spawn(&[])
    }

    /// A berth started with extra `flags`, or `None` (the test is skipped,
    /// and says so) when the suite runs against an external broker, whose
    /// settings it cannot choose.
    pub fn start_with_flags(flags: &[&str]) -> Option<Broker> {
        if is_external() {
            eprintln!("skipped: needs berth started with {flags:?}, but {TEST_URI_ENV} is set");
            return None;
        }
        Some(Self::spawn(flags))
    }

    /// `None` (the test is skipped, and says so) when running against an
    /// external broker; for behaviour only berth has.
    pub fn start_berth_only(why: &str) -> Option<Broker> {
        if is_external() {
            eprintln!("skipped against {TEST_URI_ENV}: {why}");
            return None;
        }
        Some(Self::spawn(&[]))
    }

    fn spawn(flags: &[&str]) -> Broker {
        let bin = berth_bin();
        assert!(
            bin.exists(),
            "berth binary not found at {} (build it with `cargo build --release`, or set {BIN_ENV})",
            bin.display()
        );
        let data_dir = fresh_data_dir();
        let mut child = Command::new(&bin)
            .arg("serve")
            .arg("--amqp-listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir)
            .args(flags)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel::<String>();
        let log_writer = Arc::clone(&log);
        // Keeps draining stderr for the broker's whole life, so that a full
        // pipe can never stall it, and keeps the tail for failure reports.
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = strip_ansi(&line);
                if let Some(pos) = line.find(READY_MARKER) {
                    let addrs = line[pos + READY_MARKER.len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(addrs);
                    }
                }
                let mut kept = log_writer.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() >= LOG_LINES_KEPT_MAX {
                    kept.remove(0);
                }
                kept.push(line);
            }
        });
        let mut process = BrokerProcess {
            child,
            data_dir,
            log,
        };
        let addrs = match ready_rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(addrs) => addrs,
            Err(_) => {
                let status = process.child.try_wait().ok().flatten();
                let log = process.log_tail();
                drop(process);
                panic!(
                    "berth did not log `{READY_MARKER}HOST:PORT` within {STARTUP_TIMEOUT:?} \
                     (exit status {status:?}); its log:\n{log}"
                );
            }
        };
        let amqp_addr = addrs
            .split(',')
            .find(|a| !a.is_empty())
            .unwrap_or_else(|| panic!("no address in ready line: {addrs:?}"))
            .to_owned();
        Broker {
            uri: format!("amqp://guest:guest@{amqp_addr}/%2f"),
            amqp_addr,
            process: Some(process),
        }
    }

    /// The AMQP URI of this broker (vhost `/`, user guest).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// `HOST:PORT` of the AMQP listener, for raw sockets.
    pub fn amqp_addr(&self) -> &str {
        &self.amqp_addr
    }

    /// The URI with another user, password or vhost (percent-encoded by caller).
    pub fn uri_with(&self, user: &str, password: &str, vhost: &str, query: &str) -> String {
        let q = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("amqp://{user}:{password}@{}/{vhost}{q}", self.amqp_addr)
    }

    /// A new connection as guest to vhost `/`.
    pub async fn connect(&self) -> Connection {
        bounded(
            "connect",
            Connection::connect(&self.uri, ConnectionProperties::default()),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.uri))
    }

    /// A new connection and one open channel on it.
    pub async fn channel(&self) -> (Connection, Channel) {
        let conn = self.connect().await;
        let ch = open_channel(&conn).await;
        (conn, ch)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(process) = self.process.as_mut() {
            if std::thread::panicking() {
                eprintln!(
                    "---- berth log ({}) ----\n{}\n---- end of berth log ----",
                    self.amqp_addr,
                    process.log_tail()
                );
            }
        }
    }
}

impl BrokerProcess {
    fn log_tail(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SIGTERM first so berth can shut down as an operator's would;
            // std only offers SIGKILL, so ask kill(1) for the polite signal.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn berth_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(bin);
    }
    workspace_root()
        .join("target")
        .join("release")
        .join("berth")
}

fn workspace_root() -> PathBuf {
    // crates/itest -> workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/itest lies two levels below the workspace root")
        .to_path_buf()
}

fn fresh_data_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("berth-data"));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create data dir {}: {e}", dir.display()));
    dir
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte(@..~)
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn authority_of(uri: &str) -> String {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    let hostport = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5672")
    }
}

/// Opens a channel, failing the test on error.
pub async fn open_channel(conn: &Connection) -> Channel {
    bounded("channel.open", conn.create_channel())
        .await
        .expect("channel.open")
}

// ---------------------------------------------------------------------------
// Errors

/// The AMQP reply code carried by a lapin error, if it is a protocol error.
pub fn reply_code(err: &lapin::Error) -> Option<u16> {
    match err.kind() {
        lapin::ErrorKind::ProtocolError(e) => Some(e.get_id()),
        _ => None,
    }
}

/// The AMQP reply text carried by a lapin error, if it is a protocol error.
pub fn reply_text(err: &lapin::Error) -> Option<String> {
    match err.kind() {
        lapin::ErrorKind::ProtocolError(e) => Some(e.get_message().to_string()),
        _ => None,
    }
}

/// RabbitMQ's name for a reply code; its reply texts start with `NAME - `.
pub fn reply_name(code: u16) -> &'static str {
    match code {
        200 => "OK",
        312 => "NO_ROUTE",
        320 => "CONNECTION_FORCED",
        402 => "INVALID_PATH",
        403 => "ACCESS_REFUSED",
        404 => "NOT_FOUND",
        405 => "RESOURCE_LOCKED",
        406 => "PRECONDITION_FAILED",
        501 => "FRAME_ERROR",
        502 => "SYNTAX_ERROR",
        503 => "COMMAND_INVALID",
        504 => "CHANNEL_ERROR",
        505 => "UNEXPECTED_FRAME",
        506 => "RESOURCE_ERROR",
        530 => "NOT_ALLOWED",
        540 => "NOT_IMPLEMENTED",
        541 => "INTERNAL_ERROR",
        _ => "?",
    }
}

/// Asserts that `err` is AMQP reply `code` whose text starts with the
/// code's name (`NOT_FOUND - ...`, as RabbitMQ writes it) and contains every
/// one of `fragments`; returns the text.
#[track_caller]
pub fn assert_reply(err: &lapin::Error, code: u16, fragments: &[&str]) -> String {
    let text = match reply_code(err) {
        Some(c) if c == code => reply_text(err).unwrap_or_default(),
        _ => panic!(
            "expected AMQP error {code} {}, got: {err:?}",
            reply_name(code)
        ),
    };
    if std::env::var_os(SHOW_REPLIES_ENV).is_some() {
        eprintln!("reply {code} {text:?}");
    }
    let prefix = format!("{} - ", reply_name(code));
    assert!(
        text.starts_with(&prefix),
        "reply text {text:?} should start with {prefix:?}"
    );
    for f in fragments {
        assert!(text.contains(f), "reply text {text:?} should mention {f:?}");
    }
    text
}

/// Asserts that `result` failed as [`assert_reply`] describes; returns the text.
#[track_caller]
pub fn expect_reply<T: std::fmt::Debug>(
    result: lapin::Result<T>,
    code: u16,
    fragments: &[&str],
) -> String {
    match result {
        Ok(v) => panic!(
            "expected AMQP error {code} {}, got success: {v:?}",
            reply_name(code)
        ),
        Err(e) => assert_reply(&e, code, fragments),
    }
}

/// Runs an asynchronous command (publish, ack, ...) that the broker answers
/// with a channel or connection exception, and returns that exception.
///
/// Asynchronous commands have no reply, so the exception is observed
/// through a watcher: a consumer on a server-named exclusive queue, started
/// on the same channel before the command. lapin ends every consumer of a
/// channel with the exception that closed it, whatever the order in which
/// its own frames and the broker's `channel.close` cross. (A synchronous
/// probe sent behind the command raced with the close: when the close won,
/// lapin failed the probe with "invalid channel state" instead.)
pub async fn closes_channel<T, F>(ch: &Channel, command: F) -> lapin::Error
where
    F: Future<Output = lapin::Result<T>>,
{
    let watched = bounded(
        "queue.declare (watcher)",
        ch.queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("declare the watcher's queue");
    let mut watcher = try_consume(
        ch,
        watched.name().as_str(),
        "",
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("start the watcher");
    if let Err(e) = bounded("asynchronous command", command).await {
        if reply_code(&e).is_some() {
            return e;
        }
    }
    match watcher.next_event(EVENT_TIMEOUT).await {
        Some(ConsumerEvent::Error(e)) => e,
        other => panic!("expected the broker to close the channel, but the watcher saw {other:?}"),
    }
}

/// Publishes (without mandatory) a message the broker must refuse, and
/// returns the exception it answers with.
///
/// lapin sends publishes behind other methods, so a probe cannot be ordered
/// after one; instead the channel is put in confirm mode, where lapin fails
/// the pending confirm with the exception that closed the channel.
pub async fn publish_fails(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) -> lapin::Error {
    publish_fails_with(
        ch,
        exchange,
        routing_key,
        BasicPublishOptions::default(),
        body,
        props,
    )
    .await
}

/// [`publish_fails`] with explicit publish options.
pub async fn publish_fails_with(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    options: BasicPublishOptions,
    body: &[u8],
    props: BasicProperties,
) -> lapin::Error {
    if !ch.status().confirm() {
        bounded("confirm.select", ch.confirm_select(Default::default()))
            .await
            .expect("confirm.select");
    }
    let published = bounded(
        "basic.publish",
        ch.basic_publish(
            ShortString::from(exchange),
            ShortString::from(routing_key),
            options,
            body,
            props,
        ),
    )
    .await;
    let confirm = match published {
        Ok(confirm) => confirm,
        Err(e) => return e,
    };
    match bounded("publisher confirm of a refused publish", confirm).await {
        Ok(c) => panic!("expected the broker to refuse the publish, but it confirmed it: {c:?}"),
        Err(e) => e,
    }
}

// ---------------------------------------------------------------------------
// Field tables and properties

/// A field table from `(key, value)` pairs.
pub fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

/// A long-string AMQP value.
pub fn lstr(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A signed 32-bit AMQP value.
pub fn int(n: i32) -> AMQPValue {
    AMQPValue::LongInt(n)
}

/// A signed 64-bit AMQP value.
pub fn long(n: i64) -> AMQPValue {
    AMQPValue::LongLongInt(n)
}

/// A header value as a string, whatever string type the broker used.
pub fn value_str(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// A header value as an integer, whatever integer type the broker used.
pub fn value_int(v: &AMQPValue) -> Option<i64> {
    match *v {
        AMQPValue::ShortShortInt(n) => Some(n.into()),
        AMQPValue::ShortShortUInt(n) => Some(n.into()),
        AMQPValue::ShortInt(n) => Some(n.into()),
        AMQPValue::ShortUInt(n) => Some(n.into()),
        AMQPValue::LongInt(n) => Some(n.into()),
        AMQPValue::LongUInt(n) => Some(n.into()),
        AMQPValue::LongLongInt(n) => Some(n),
        AMQPValue::Timestamp(n) => i64::try_from(n).ok(),
        _ => None,
    }
}

/// The headers of a delivery as a map (empty when it has none).
pub fn headers_of(props: &BasicProperties) -> BTreeMap<String, AMQPValue> {
    props
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `x-death` header of a dead-lettered message, as a list of tables.
#[track_caller]
pub fn x_death(props: &BasicProperties) -> Vec<BTreeMap<String, AMQPValue>> {
    let headers = headers_of(props);
    let Some(AMQPValue::FieldArray(entries)) = headers.get("x-death") else {
        panic!("no x-death array in headers: {headers:?}");
    };
    entries
        .as_slice()
        .iter()
        .map(|e| match e {
            AMQPValue::FieldTable(t) => t
                .inner()
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            other => panic!("x-death entry is not a table: {other:?}"),
        })
        .collect()
}

/// A field array of long strings.
pub fn str_array(items: &[&str]) -> AMQPValue {
    let mut a = FieldArray::default();
    for i in items {
        a.push(lstr(i));
    }
    AMQPValue::FieldArray(a)
}

// ---------------------------------------------------------------------------
// Publishing and getting

/// Publishes `body` with default properties, without mandatory.
pub async fn publish(ch: &Channel, exchange: &str, routing_key: &str, body: &[u8]) {
    publish_with(ch, exchange, routing_key, body, BasicProperties::default()).await;
}

/// Publishes `body` with `props`, without mandatory.
pub async fn publish_with(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) {
    bounded(
        "basic.publish",
        ch.basic_publish(
            ShortString::from(exchange),
            ShortString::from(routing_key),
            BasicPublishOptions::default(),
            body,
            props,
        ),
    )
    .await
    .expect("basic.publish");
}

/// Declares a fresh, unique, non-durable queue with `args`; returns its name.
pub async fn declare_queue(ch: &Channel, prefix: &str, args: FieldTable) -> String {
    let name = unique(prefix);
    bounded(
        "queue.declare",
        ch.queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                auto_delete: false,
                ..QueueDeclareOptions::default()
            },
            args,
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("queue.declare {name}: {e}"));
    name
}

/// `basic.get` with acks; `None` means get-empty.
pub async fn get(ch: &Channel, queue: &str) -> Option<BasicGetMessage> {
    bounded(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .expect("basic.get")
}

/// `basic.get` with no-ack; `None` means get-empty.
pub async fn get_no_ack(ch: &Channel, queue: &str) -> Option<BasicGetMessage> {
    bounded(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
}

/// Drains `queue` with no-ack gets and returns the bodies in order.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    while let Some(m) = get_no_ack(ch, queue).await {
        bodies.push(m.delivery.data);
    }
    bodies
}

/// Drains `queue` and returns the bodies as strings.
pub async fn drain_strings(ch: &Channel, queue: &str) -> Vec<String> {
    drain(ch, queue)
        .await
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// Polls `queue` with `queue.declare passive` until it holds `count`
/// messages or [`EVENT_TIMEOUT`] passes; returns the last count seen.
pub async fn wait_for_message_count(ch: &Channel, queue: &str, count: u32) -> u32 {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue.declare passive");
        if q.message_count() == count || Instant::now() >= deadline {
            return q.message_count();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// Consuming

/// What a consumer observes, in the order the broker sent it.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// A `basic.deliver`.
    Delivery(Box<Delivery>),
    /// The consumer was cancelled (by `basic.cancel` from the broker, or
    /// because the channel closed).
    Cancelled,
    /// An error ended the consumer.
    Error(lapin::Error),
}

/// A consumer whose deliveries arrive, in broker order, on a tokio channel.
///
/// lapin's delegate is called synchronously from its reader for each
/// delivery; forwarding there (rather than in the spawned future) keeps the
/// order the broker sent.
pub struct Deliveries {
    /// The consumer tag (server-generated when none was given).
    pub tag: String,
    events: tmpsc::UnboundedReceiver<ConsumerEvent>,
}

struct Forwarder(tmpsc::UnboundedSender<ConsumerEvent>);

impl ConsumerDelegate for Forwarder {
    fn on_new_delivery(
        &self,
        delivery: DeliveryResult,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let event = match delivery {
            Ok(Some(d)) => ConsumerEvent::Delivery(Box::new(d)),
            Ok(None) => ConsumerEvent::Cancelled,
            Err(e) => ConsumerEvent::Error(e),
        };
        let _ = self.0.send(event);
        Box::pin(std::future::ready(()))
    }
}

/// Starts a consumer; the result is the broker's answer to `basic.consume`.
pub async fn try_consume(
    ch: &Channel,
    queue: &str,
    tag: &str,
    options: BasicConsumeOptions,
    args: FieldTable,
) -> lapin::Result<Deliveries> {
    let consumer = bounded(
        "basic.consume",
        ch.basic_consume(queue.into(), tag.into(), options, args),
    )
    .await?;
    let (tx, rx) = tmpsc::unbounded_channel();
    let tag = consumer.tag().to_string();
    consumer.set_delegate(Forwarder(tx));
    Ok(Deliveries { tag, events: rx })
}

/// Starts a consumer with acks and a server-generated tag.
pub async fn consume(ch: &Channel, queue: &str) -> Deliveries {
    try_consume(
        ch,
        queue,
        "",
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("basic.consume {queue}: {e}"))
}

impl Deliveries {
    /// The next event, or `None` after `wait` with nothing.
    pub async fn next_event(&mut self, wait: Duration) -> Option<ConsumerEvent> {
        tokio::time::timeout(wait, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next delivery; fails the test if none comes within [`EVENT_TIMEOUT`].
    #[track_caller]
    pub fn recv(&mut self) -> impl Future<Output = Delivery> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            match self.next_event(EVENT_TIMEOUT).await {
                Some(ConsumerEvent::Delivery(d)) => *d,
                other => panic!("expected a delivery (at {caller}), got {other:?}"),
            }
        }
    }

    /// `n` deliveries in order.
    pub async fn take(&mut self, n: usize) -> Vec<Delivery> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.recv().await);
        }
        out
    }

    /// Asserts that nothing arrives for [`QUIET_PERIOD`].
    #[track_caller]
    pub fn expect_quiet(&mut self) -> impl Future<Output = ()> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            if let Some(e) = self.next_event(QUIET_PERIOD).await {
                panic!("expected no consumer event (at {caller}), got {e:?}");
            }
        }
    }

    /// Waits for the consumer to be cancelled (skipping nothing: a delivery
    /// first is a failure).
    #[track_caller]
    pub fn expect_cancelled(&mut self) -> impl Future<Output = ()> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            match self.next_event(EVENT_TIMEOUT).await {
                Some(ConsumerEvent::Cancelled) => {}
                other => panic!("expected a cancel notification (at {caller}), got {other:?}"),
            }
        }
    }
}

/// The body of a delivery as a string.
pub fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.data).into_owned()
}

/// The bodies of deliveries as strings.
pub fn bodies(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(body).collect()
}

// ---------------------------------------------------------------------------
// Raw AMQP, for what lapin does not expose (the server's connection.start)

/// One AMQP frame read from a raw socket.
#[derive(Debug)]
pub struct RawFrame {
    /// Frame type: 1 method, 2 header, 3 body, 8 heartbeat.
    pub frame_type: u8,
    /// Channel number.
    pub channel: u16,
    /// Payload (without the frame end byte).
    pub payload: Vec<u8>,
}

/// A raw TCP connection speaking just enough AMQP for handshake tests.
pub struct RawConnection {
    stream: tokio::net::TcpStream,
}

impl RawConnection {
    /// Connects to `addr` (`HOST:PORT`).
    pub async fn connect(addr: &str) -> RawConnection {
        let stream = bounded("tcp connect", tokio::net::TcpStream::connect(addr))
            .await
            .unwrap_or_else(|e| panic!("tcp connect {addr}: {e}"));
        RawConnection { stream }
    }

    /// Writes raw bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("socket write");
    }

    /// Reads exactly `n` bytes, or `None` if the peer closed first.
    pub async fn read_exact(&mut self, n: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; n];
        match bounded("socket read", self.stream.read_exact(&mut buf)).await {
            Ok(_) => Some(buf),
            Err(_) => None,
        }
    }

    /// Reads one frame, or `None` if the peer closed the socket.
    pub async fn read_frame(&mut self) -> Option<RawFrame> {
        let header = self.read_exact(7).await?;
        let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]);
        let mut payload = self.read_exact(size as usize + 1).await?;
        let end = payload.pop();
        assert_eq!(end, Some(0xCE), "frame end byte");
        Some(RawFrame {
            frame_type: header[0],
            channel: u16::from_be_bytes([header[1], header[2]]),
            payload,
        })
    }

    /// Reads until the peer closes the socket (bounded by [`EVENT_TIMEOUT`]);
    /// returns what it sent.
    pub async fn read_to_close(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = bounded("read until close", self.stream.read_to_end(&mut out)).await;
        out
    }
}

/// A parsed AMQP method frame payload.
pub fn parse_method(payload: &[u8]) -> lapin::protocol::AMQPClass {
    match lapin::protocol::parse_class(payload) {
        Ok((_, class)) => class,
        Err(e) => panic!("cannot parse method frame {payload:?}: {e:?}"),
    }
}

/// The AMQP 0-9-1 protocol header a client sends first.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";

/// Encodes a method frame: `class_id`, `method_id`, then `args` as given.
pub fn method_frame(channel: u16, class_id: u16, method_id: u16, args: &[u8]) -> Vec<u8> {
    let size = u32::try_from(4 + args.len()).expect("method frame fits in u32");
    let mut f = Vec::with_capacity(12 + args.len());
    f.push(1);
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&size.to_be_bytes());
    f.extend_from_slice(&class_id.to_be_bytes());
    f.extend_from_slice(&method_id.to_be_bytes());
    f.extend_from_slice(args);
    f.push(0xCE);
    f
}

/// Appends an AMQP short string.
pub fn put_shortstr(buf: &mut Vec<u8>, s: &str) {
    buf.push(u8::try_from(s.len()).expect("short string fits in 255 bytes"));
    buf.extend_from_slice(s.as_bytes());
}

/// Appends an AMQP long string.
pub fn put_longstr(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(
        &u32::try_from(s.len())
            .expect("long string fits in u32")
            .to_be_bytes(),
    );
    buf.extend_from_slice(s);
}

/// What the server proposed during a raw handshake.
#[derive(Debug)]
pub struct RawHandshake {
    /// The server's `connection.start`.
    pub start: lapin::protocol::connection::Start,
    /// The server's `connection.tune`.
    pub tune: lapin::protocol::connection::Tune,
}

impl RawConnection {
    /// Sends the protocol header and reads `connection.start`.
    pub async fn read_start(&mut self) -> lapin::protocol::connection::Start {
        self.send(PROTOCOL_HEADER).await;
        let frame = self.read_frame().await.expect("connection.start frame");
        match parse_method(&frame.payload) {
            lapin::protocol::AMQPClass::Connection(
                lapin::protocol::connection::AMQPMethod::Start(start),
            ) => start,
            other => panic!("expected connection.start, got {other:?}"),
        }
    }

    /// Runs the whole handshake as guest on vhost `/`, answering tune with
    /// the given `heartbeat_s` and the server's own channel_max/frame_max.
    pub async fn handshake(&mut self, heartbeat_s: u16) -> RawHandshake {
        let start = self.read_start().await;
        let mut args = Vec::new();
        args.extend_from_slice(&0u32.to_be_bytes()); // empty client-properties
        put_shortstr(&mut args, "PLAIN");
        put_longstr(&mut args, b"\0guest\0guest");
        put_shortstr(&mut args, "en_US");
        self.send(&method_frame(0, 10, 11, &args)).await;
        let frame = self.read_frame().await.expect("connection.tune frame");
        let tune = match parse_method(&frame.payload) {
            lapin::protocol::AMQPClass::Connection(
                lapin::protocol::connection::AMQPMethod::Tune(tune),
            ) => tune,
            other => panic!("expected connection.tune, got {other:?}"),
        };
        let mut args = Vec::new();
        args.extend_from_slice(&tune.channel_max.to_be_bytes());
        args.extend_from_slice(&tune.frame_max.to_be_bytes());
        args.extend_from_slice(&heartbeat_s.to_be_bytes());
        self.send(&method_frame(0, 10, 31, &args)).await;
        let mut args = Vec::new();
        put_shortstr(&mut args, "/");
        put_shortstr(&mut args, "");
        args.push(0);
        self.send(&method_frame(0, 10, 40, &args)).await;
        let frame = self.read_frame().await.expect("connection.open-ok frame");
        match parse_method(&frame.payload) {
            lapin::protocol::AMQPClass::Connection(
                lapin::protocol::connection::AMQPMethod::OpenOk(_),
            ) => {}
            other => panic!("expected connection.open-ok, got {other:?}"),
        }
        RawHandshake { start, tune }
    }
}

/// A `connection.close` the broker sent: reply code, text, and the class and
/// method ids of the offending command.
#[derive(Debug)]
pub struct RawClose {
    /// Reply code.
    pub reply_code: u16,
    /// Reply text.
    pub reply_text: String,
    /// Class id of the method that caused the close (0 if none).
    pub class_id: u16,
    /// Method id of the method that caused the close (0 if none).
    pub method_id: u16,
}

impl RawConnection {
    /// Reads frames (skipping heartbeats and others) until the broker's
    /// `connection.close`, answers it with close-ok, and returns it. Fails
    /// the test if the socket closes first.
    pub async fn expect_connection_close(&mut self) -> RawClose {
        loop {
            let Some(frame) = self.read_frame().await else {
                panic!("broker closed the socket without connection.close");
            };
            if frame.frame_type != 1 || frame.channel != 0 {
                continue;
            }
            if let lapin::protocol::AMQPClass::Connection(
                lapin::protocol::connection::AMQPMethod::Close(close),
            ) = parse_method(&frame.payload)
            {
                if std::env::var_os(SHOW_REPLIES_ENV).is_some() {
                    eprintln!(
                        "connection.close {} {:?} {}/{}",
                        close.reply_code, close.reply_text, close.class_id, close.method_id
                    );
                }
                self.send(&method_frame(0, 10, 51, &[])).await;
                return RawClose {
                    reply_code: close.reply_code,
                    reply_text: close.reply_text.to_string(),
                    class_id: close.class_id,
                    method_id: close.method_id,
                };
            }
        }
    }
}
