//! Raw AMQP over a TCP socket, for what lapin does not expose (the server's
//! `connection.start`, malformed frames).

use crate::{bounded, SHOW_REPLIES_ENV};

pub use lapin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
