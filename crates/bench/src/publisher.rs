//! A confirmed publisher that costs the bench little CPU per message
//! (issue 20 goal 8): one socket driven by the task that publishes, no
//! I/O thread, no per-message allocation.
//!
//! lapin, which the bench uses for everything else, runs an I/O thread per
//! connection and hands every frame to it through channels; a profile of
//! `berth bench fanin` put ~45% of the client's samples in the futex
//! wake-ups of those hand-offs, and the client spent about as much CPU per
//! message as the broker. Here the publishing task writes and reads the
//! socket itself:
//!
//! - a publish (method, content header and body frames) is encoded once
//!   into a [`PublishTemplate`]; a batch of `n` publishes is `n` copies of
//!   it appended to one reused buffer and written with one `write`;
//! - confirms are read many frames per `read` into one reused buffer, and
//!   a `basic.ack` is decoded in place (everything else, rare, goes
//!   through amq-protocol's parser).
//!
//! What is measured does not change: the same persistent (delivery-mode 2)
//! publishes to the default exchange on one channel in confirm mode, and a
//! publish counts as confirmed only on the broker's `basic.ack` for its
//! delivery tag (`multiple` covering it); a `basic.nack` is counted and
//! reported by the caller as a failure.
//!
//! Invariants:
//! - delivery tags are 1, 2, 3, … in publish order on the one channel, so
//!   the unconfirmed tags are exactly `confirmed_through + 1 ..= published`;
//! - `outcome[i]` is the state of tag `confirmed_through + 1 + i`, and
//!   `outcome.len() == published - confirmed_through`;
//! - an ack or nack for a tag outside that range is a protocol error of
//!   the broker, reported, never ignored.

use std::collections::VecDeque;

use amq_protocol::frame::{gen_frame, parse_frame, AMQPFrame};
use amq_protocol::protocol::{basic, channel, confirm, connection, AMQPClass};
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use amq_protocol::uri::AMQPUri;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::BenchError;

/// The AMQP 0-9-1 protocol header a client sends first.
const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
/// Frame type, channel (2) and payload size (4).
const FRAME_HEADER_BYTES: usize = 7;
/// Header plus the frame-end octet.
const FRAME_OVERHEAD_BYTES: usize = FRAME_HEADER_BYTES + 1;
const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CLASS_BASIC: u16 = 60;
const METHOD_BASIC_PUBLISH: u16 = 40;
const METHOD_BASIC_ACK: u16 = 80;
/// Property flags with only delivery-mode set (bit 12, AMQP 0-9-1 §4.2.6.1).
const PROPERTY_FLAG_DELIVERY_MODE: u16 = 1 << 12;
const DELIVERY_MODE_PERSISTENT: u8 = 2;
/// The one channel this publisher uses.
const CHANNEL: u16 = 1;
/// Largest frame this client asks for (the broker's may be smaller).
const FRAME_MAX_BYTES: u32 = 131_072;
/// Bytes read per `read` call at most: room for thousands of acks.
const READ_CHUNK_BYTES: usize = 64 * 1024;

fn protocol(context: impl Into<String>) -> BenchError {
    BenchError::Protocol(context.into())
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::Io { context, source }
}

/// The bytes of one persistent publish to the default exchange: method
/// frame, content header frame, body frame(s) of at most `frame_max`.
#[derive(Debug, Clone)]
pub struct PublishTemplate {
    bytes: Vec<u8>,
}

impl PublishTemplate {
    /// Encodes `basic.publish` to `routing_key` through the default
    /// exchange with `body` as persistent content, for a connection whose
    /// negotiated frame size is `frame_max` (0: no limit).
    pub fn new(routing_key: &str, body: &[u8], frame_max: u32) -> Result<Self, BenchError> {
        let key = routing_key.as_bytes();
        let key_len = u8::try_from(key.len())
            .map_err(|_| protocol(format!("routing key of {} bytes", key.len())))?;
        let chunk_max = match frame_max {
            0 => usize::MAX,
            n => (n as usize).saturating_sub(FRAME_OVERHEAD_BYTES).max(1),
        };
        let mut bytes = Vec::with_capacity(body.len() + 64 + key.len());
        // basic.publish: class, method, ticket, exchange "", routing key, bits.
        let method_len = 2 + 2 + 2 + 1 + 1 + key.len() + 1;
        put_frame_header(&mut bytes, FRAME_METHOD, method_len);
        bytes.extend_from_slice(&CLASS_BASIC.to_be_bytes());
        bytes.extend_from_slice(&METHOD_BASIC_PUBLISH.to_be_bytes());
        bytes.extend_from_slice(&0u16.to_be_bytes());
        bytes.push(0);
        bytes.push(key_len);
        bytes.extend_from_slice(key);
        bytes.push(0); // mandatory = immediate = false
        bytes.push(FRAME_END);
        // Content header: class, weight, body size, flags, delivery-mode.
        put_frame_header(&mut bytes, FRAME_HEADER, 2 + 2 + 8 + 2 + 1);
        bytes.extend_from_slice(&CLASS_BASIC.to_be_bytes());
        bytes.extend_from_slice(&0u16.to_be_bytes());
        bytes.extend_from_slice(&(body.len() as u64).to_be_bytes());
        bytes.extend_from_slice(&PROPERTY_FLAG_DELIVERY_MODE.to_be_bytes());
        bytes.push(DELIVERY_MODE_PERSISTENT);
        bytes.push(FRAME_END);
        for chunk in body.chunks(chunk_max) {
            put_frame_header(&mut bytes, FRAME_BODY, chunk.len());
            bytes.extend_from_slice(chunk);
            bytes.push(FRAME_END);
        }
        Ok(PublishTemplate { bytes })
    }

    /// The encoded frames of one publish.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

fn put_frame_header(out: &mut Vec<u8>, kind: u8, payload_len: usize) {
    out.push(kind);
    out.extend_from_slice(&CHANNEL.to_be_bytes());
    // Payloads here are bounded by frame_max (a u32) or a short string.
    out.extend_from_slice(&u32::try_from(payload_len).unwrap_or(u32::MAX).to_be_bytes());
}

/// What the broker said about one delivery tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pending,
    Acked,
    Nacked,
}

/// Bytes received from the broker and the whole frames among them (no
/// I/O). Zeroed only when it grows (a frame larger than it), never per
/// read: zeroing 64 KiB per read was 7.6% of the client's profile.
///
/// Invariant: `at <= end <= buf.len()`; `buf[at..end]` is what was
/// received and not yet taken.
struct ReadBuf {
    buf: Vec<u8>,
    at: usize,
    end: usize,
}

impl ReadBuf {
    fn new() -> Self {
        ReadBuf {
            buf: vec![0; READ_CHUNK_BYTES],
            at: 0,
            end: 0,
        }
    }

    /// Where to read next: behind the untaken bytes (moved to the front),
    /// with room for at least the rest of the next frame.
    fn room(&mut self) -> &mut [u8] {
        if self.at > 0 {
            self.buf.copy_within(self.at..self.end, 0);
            self.end -= self.at;
            self.at = 0;
        }
        let want = self.next_len().unwrap_or(0).max(READ_CHUNK_BYTES);
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`ReadBuf::room`].
    fn filled(&mut self, n: usize) {
        self.end += n;
        debug_assert!(self.end <= self.buf.len());
    }

    /// Bytes of the next whole frame, if its header has arrived.
    fn next_len(&self) -> Option<usize> {
        let b = &self.buf[self.at..self.end];
        let size = u32::from_be_bytes(b.get(3..7)?.try_into().ok()?);
        Some(FRAME_HEADER_BYTES + size as usize + 1)
    }

    /// The next whole frame, taken: (type, channel, payload range in
    /// `buf`, valid until the next [`ReadBuf::room`]).
    fn take(&mut self) -> Result<Option<(u8, u16, std::ops::Range<usize>)>, BenchError> {
        let Some(len) = self.next_len() else {
            return Ok(None);
        };
        let b = &self.buf[self.at..self.end];
        if b.len() < len {
            return Ok(None);
        }
        if b[len - 1] != FRAME_END {
            return Err(protocol(format!("frame end byte is {:#04x}", b[len - 1])));
        }
        let kind = b[0];
        let channel = u16::from_be_bytes([b[1], b[2]]);
        let start = self.at + FRAME_HEADER_BYTES;
        let range = start..self.at + len - 1;
        self.at += len;
        Ok(Some((kind, channel, range)))
    }
}

/// One AMQP connection with one channel in confirm mode.
pub struct Publisher {
    stream: TcpStream,
    /// Received bytes not yet parsed.
    read_buf: ReadBuf,
    /// Publishes encoded for the next write; reused.
    write_buf: Vec<u8>,
    frame_max: u32,
    confirms: Confirms,
}

/// The confirm bookkeeping of one channel in confirm mode (no I/O).
#[derive(Debug, Default)]
struct Confirms {
    /// Delivery tag of the last publish (0: none yet).
    published: u64,
    /// Every tag up to this one has an outcome and left `outcome`.
    confirmed_through: u64,
    /// Outcomes of tags `confirmed_through + 1 ..= published`.
    outcome: VecDeque<Outcome>,
    /// Tags acked / nacked so far.
    acked: u64,
    nacked: u64,
}

impl Confirms {
    fn unconfirmed(&self) -> u64 {
        self.published - self.confirmed_through
    }

    /// `n` more publishes went out, tags `published + 1 ..= published + n`.
    fn sent(&mut self, n: u64) {
        self.published += n;
        self.outcome.extend(std::iter::repeat_n(
            Outcome::Pending,
            usize::try_from(n).unwrap_or(0),
        ));
    }

    /// Records an ack or nack of `tag` (and, with `multiple`, of every
    /// earlier unconfirmed tag), then retires the settled prefix.
    fn settle(&mut self, tag: u64, multiple: bool, what: Outcome) -> Result<(), BenchError> {
        if tag <= self.confirmed_through || tag > self.published {
            return Err(protocol(format!(
                "{what:?} for delivery tag {tag}, outside the unconfirmed {}..={}",
                self.confirmed_through + 1,
                self.published
            )));
        }
        let i = usize::try_from(tag - self.confirmed_through - 1).expect("within outcome");
        let first = if multiple { 0 } else { i };
        for o in self.outcome.range_mut(first..=i) {
            if *o == Outcome::Pending {
                *o = what;
                match what {
                    Outcome::Acked => self.acked += 1,
                    Outcome::Nacked => self.nacked += 1,
                    Outcome::Pending => {}
                }
            }
        }
        while self.outcome.front().is_some_and(|o| *o != Outcome::Pending) {
            self.outcome.pop_front();
            self.confirmed_through += 1;
        }
        debug_assert_eq!(
            self.outcome.len() as u64,
            self.published - self.confirmed_through
        );
        Ok(())
    }
}

impl Publisher {
    /// Connects (PLAIN login), opens channel 1 and selects confirm mode.
    /// `name` is shown as the connection's name by the broker.
    pub async fn connect(uri: &str, name: &str) -> Result<Publisher, BenchError> {
        let shown = crate::uri::redact(uri);
        let parsed: AMQPUri = uri
            .parse()
            .map_err(|e| BenchError::Usage(format!("AMQP URI {shown}: {e}")))?;
        let addr = (parsed.authority.host.as_str(), parsed.authority.port);
        let stream = TcpStream::connect(addr)
            .await
            .map_err(io(format!("connect to {shown}")))?;
        stream
            .set_nodelay(true)
            .map_err(io("set TCP_NODELAY".to_string()))?;
        let mut p = Publisher {
            stream,
            read_buf: ReadBuf::new(),
            write_buf: Vec::new(),
            frame_max: FRAME_MAX_BYTES,
            confirms: Confirms::default(),
        };
        p.handshake(&parsed, name).await.map_err(|e| match e {
            BenchError::Protocol(m) => protocol(format!("{shown} ({name}): {m}")),
            other => other,
        })?;
        Ok(p)
    }

    async fn handshake(&mut self, uri: &AMQPUri, name: &str) -> Result<(), BenchError> {
        self.stream
            .write_all(PROTOCOL_HEADER)
            .await
            .map_err(io("send protocol header"))?;
        let start = match self.next_method(0).await? {
            AMQPClass::Connection(connection::AMQPMethod::Start(s)) => s,
            other => {
                return Err(protocol(format!(
                    "expected connection.start, got {other:?}"
                )))
            }
        };
        if !start
            .mechanisms
            .to_string()
            .split(' ')
            .any(|m| m == "PLAIN")
        {
            return Err(protocol(format!(
                "broker offers no PLAIN login ({})",
                start.mechanisms
            )));
        }
        let mut props = FieldTable::default();
        props.insert(
            "connection_name".into(),
            AMQPValue::LongString(LongString::from(name)),
        );
        props.insert(
            "product".into(),
            AMQPValue::LongString(LongString::from("berth bench")),
        );
        let user = &uri.authority.userinfo;
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
                client_properties: props,
                mechanism: ShortString::from("PLAIN"),
                response: LongString::from(format!("\0{}\0{}", user.username, user.password)),
                locale: ShortString::from("en_US"),
            })),
        )
        .await?;
        let tune = match self.next_method(0).await? {
            AMQPClass::Connection(connection::AMQPMethod::Tune(t)) => t,
            other => return Err(protocol(format!("expected connection.tune, got {other:?}"))),
        };
        self.frame_max = match tune.frame_max {
            0 => FRAME_MAX_BYTES,
            n => n.min(FRAME_MAX_BYTES),
        };
        // Heartbeats off: a bench connection is never idle for long, and
        // the broker's close (not a missed heartbeat) ends a broken one.
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
                channel_max: 1,
                frame_max: self.frame_max,
                heartbeat: 0,
            })),
        )
        .await?;
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
                virtual_host: ShortString::from(uri.vhost.clone()),
            })),
        )
        .await?;
        match self.next_method(0).await? {
            AMQPClass::Connection(connection::AMQPMethod::OpenOk(_)) => {}
            other => {
                return Err(protocol(format!(
                    "expected connection.open-ok, got {other:?}"
                )))
            }
        }
        self.send_method(
            CHANNEL,
            AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
        )
        .await?;
        match self.next_method(CHANNEL).await? {
            AMQPClass::Channel(channel::AMQPMethod::OpenOk(_)) => {}
            other => return Err(protocol(format!("expected channel.open-ok, got {other:?}"))),
        }
        self.send_method(
            CHANNEL,
            AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
                nowait: false,
            })),
        )
        .await?;
        match self.next_method(CHANNEL).await? {
            AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(_)) => Ok(()),
            other => Err(protocol(format!(
                "expected confirm.select-ok, got {other:?}"
            ))),
        }
    }

    /// The negotiated frame size, for [`PublishTemplate::new`].
    #[must_use]
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// Publishes not yet acked or nacked.
    #[must_use]
    pub fn unconfirmed(&self) -> u64 {
        self.confirms.unconfirmed()
    }

    /// Publishes sent so far.
    #[must_use]
    pub fn published(&self) -> u64 {
        self.confirms.published
    }

    /// Publishes the broker acked so far.
    #[must_use]
    pub fn acked(&self) -> u64 {
        self.confirms.acked
    }

    /// Publishes the broker nacked so far.
    #[must_use]
    pub fn nacked(&self) -> u64 {
        self.confirms.nacked
    }

    /// Sends `n` copies of `template` with one `write` (one syscall for
    /// the batch when the socket takes it whole).
    pub async fn publish(&mut self, template: &PublishTemplate, n: u64) -> Result<(), BenchError> {
        self.write_buf.clear();
        for _ in 0..n {
            self.write_buf.extend_from_slice(template.bytes());
        }
        self.stream
            .write_all(&self.write_buf)
            .await
            .map_err(io("publish"))?;
        self.confirms.sent(n);
        Ok(())
    }

    /// Reads confirms until at most `unconfirmed_max` publishes are
    /// unconfirmed; each read takes whatever has arrived (many frames).
    pub async fn wait_confirms(&mut self, unconfirmed_max: u64) -> Result<(), BenchError> {
        while self.unconfirmed() > unconfirmed_max {
            self.fill().await?;
            self.drain_frames()?;
        }
        Ok(())
    }

    /// Publishes `n` copies of `template` keeping at most `window`
    /// unconfirmed: each time confirms free room, the room is filled with
    /// one write. Ticks `pb` per settled publish; returns (published,
    /// acked); a nack is an error (the broker refused responsibility).
    pub async fn publish_windowed(
        &mut self,
        template: &PublishTemplate,
        n: u64,
        window: u64,
        pb: &indicatif::ProgressBar,
    ) -> Result<(u64, u64), BenchError> {
        let window = window.max(1);
        let (published0, settled0) = (self.published(), self.acked() + self.nacked());
        let mut ticked = settled0;
        while self.published() - published0 < n || self.unconfirmed() > 0 {
            let room = window.saturating_sub(self.unconfirmed());
            let k = room.min(n - (self.published() - published0));
            if k > 0 {
                self.publish(template, k).await?;
            }
            let left_to_send = self.published() - published0 < n;
            self.wait_confirms(if left_to_send { window - 1 } else { 0 })
                .await?;
            let settled = self.acked() + self.nacked();
            pb.inc(settled - ticked);
            ticked = settled;
            if self.nacked() > 0 {
                return Err(BenchError::Accounting("broker nacked a publish".into()));
            }
        }
        Ok((self.published() - published0, self.acked() - settled0))
    }

    /// Closes the channel's connection politely (`connection.close`, then
    /// waits for `close-ok`); a broker that already went away is no error.
    pub async fn close(mut self) -> Result<(), BenchError> {
        self.send_method(
            0,
            AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
                reply_code: 200,
                reply_text: ShortString::from("bench done"),
                class_id: 0,
                method_id: 0,
            })),
        )
        .await?;
        loop {
            match self.next_method(0).await {
                Ok(AMQPClass::Connection(connection::AMQPMethod::CloseOk(_))) => return Ok(()),
                Ok(_) => {}
                Err(BenchError::Io { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    async fn send_method(&mut self, channel: u16, method: AMQPClass) -> Result<(), BenchError> {
        let frame = AMQPFrame::Method(channel, method);
        let bytes = cookie_factory::gen_simple(gen_frame(&frame), Vec::new())
            .map_err(|e| protocol(format!("encode {frame:?}: {e:?}")))?;
        self.stream
            .write_all(&bytes)
            .await
            .map_err(io("send method"))
    }

    /// Reads more bytes (at least one, as many as have arrived) into the
    /// buffer behind what is not yet parsed.
    async fn fill(&mut self) -> Result<(), BenchError> {
        let n = self
            .stream
            .read(self.read_buf.room())
            .await
            .map_err(io("read from broker"))?;
        if n == 0 {
            return Err(BenchError::Io {
                context: "read from broker".into(),
                source: std::io::ErrorKind::UnexpectedEof.into(),
            });
        }
        self.read_buf.filled(n);
        Ok(())
    }

    /// Handles every whole frame buffered: acks and nacks, heartbeats;
    /// a close from the broker is an error carrying its reply.
    fn drain_frames(&mut self) -> Result<(), BenchError> {
        while let Some((kind, ch, range)) = self.read_buf.take()? {
            match kind {
                FRAME_HEARTBEAT => {}
                FRAME_METHOD => {
                    let p = &self.read_buf.buf[range.clone()];
                    if ch == CHANNEL
                        && p.len() >= 13
                        && p[..2] == CLASS_BASIC.to_be_bytes()
                        && p[2..4] == METHOD_BASIC_ACK.to_be_bytes()
                    {
                        let tag = u64::from_be_bytes(p[4..12].try_into().expect("8 bytes"));
                        self.confirms.settle(tag, p[12] & 1 == 1, Outcome::Acked)?;
                    } else {
                        let class = self.parse_method(range.start - FRAME_HEADER_BYTES, range)?;
                        self.other_method(ch, class)?;
                    }
                }
                other => {
                    return Err(protocol(format!(
                        "unexpected frame type {other} on channel {ch}"
                    )))
                }
            }
        }
        Ok(())
    }

    fn parse_method(
        &self,
        frame_start: usize,
        payload: std::ops::Range<usize>,
    ) -> Result<AMQPClass, BenchError> {
        let whole = &self.read_buf.buf[frame_start..=payload.end];
        match parse_frame(whole) {
            Ok((_, AMQPFrame::Method(_, class))) => Ok(class),
            Ok((_, other)) => Err(protocol(format!("expected a method frame, got {other:?}"))),
            Err(e) => Err(protocol(format!("cannot parse a method frame: {e:?}"))),
        }
    }

    fn other_method(&mut self, ch: u16, class: AMQPClass) -> Result<(), BenchError> {
        match class {
            AMQPClass::Basic(basic::AMQPMethod::Ack(a)) if ch == CHANNEL => {
                self.confirms
                    .settle(a.delivery_tag, a.multiple, Outcome::Acked)
            }
            AMQPClass::Basic(basic::AMQPMethod::Nack(n)) if ch == CHANNEL => {
                self.confirms
                    .settle(n.delivery_tag, n.multiple, Outcome::Nacked)
            }
            // connection.blocked / unblocked: the broker pauses reading us;
            // nothing to do but wait for confirms as usual.
            AMQPClass::Connection(
                connection::AMQPMethod::Blocked(_) | connection::AMQPMethod::Unblocked(_),
            ) => Ok(()),
            AMQPClass::Connection(connection::AMQPMethod::Close(c)) => Err(protocol(format!(
                "broker closed the connection: {} {}",
                c.reply_code, c.reply_text
            ))),
            AMQPClass::Channel(channel::AMQPMethod::Close(c)) => Err(protocol(format!(
                "broker closed the channel: {} {}",
                c.reply_code, c.reply_text
            ))),
            other => Err(protocol(format!(
                "unexpected method on channel {ch}: {other:?}"
            ))),
        }
    }

    /// The next method frame on `expect_channel` during the handshake or
    /// close; heartbeats are skipped, a connection.close is an error.
    async fn next_method(&mut self, expect_channel: u16) -> Result<AMQPClass, BenchError> {
        loop {
            while let Some((kind, ch, range)) = self.read_buf.take()? {
                match kind {
                    FRAME_HEARTBEAT => {}
                    FRAME_METHOD => {
                        let class = self.parse_method(range.start - FRAME_HEADER_BYTES, range)?;
                        if let AMQPClass::Connection(connection::AMQPMethod::Close(c)) = &class {
                            return Err(protocol(format!(
                                "broker closed the connection: {} {}",
                                c.reply_code, c.reply_text
                            )));
                        }
                        if ch == expect_channel || ch == 0 {
                            return Ok(class);
                        }
                    }
                    other => {
                        return Err(protocol(format!(
                            "unexpected frame type {other} on channel {ch}"
                        )))
                    }
                }
            }
            self.fill().await?;
        }
    }
}

#[cfg(test)]
mod tests;
