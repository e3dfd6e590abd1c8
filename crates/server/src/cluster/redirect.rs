//! A follower's AMQP listener: every client is turned away with
//! `connection.close 320 CONNECTION_FORCED` naming the leader and its AMQP
//! address, so a client with a host list reconnects there.
//!
//! The close is sent once the client asked for `connection.open` (after
//! `start`/`start-ok` and `tune`/`tune-ok`; the credentials are not
//! checked: a follower holds no broker and grants nothing), where every
//! RabbitMQ client reports it as the broker closing the connection with
//! that reply code and text (pika: `ConnectionClosedByBroker(320, ...)`).
//!
//! On an AMQPS listener the TLS handshake comes first (the server's own
//! certificate, as the leader presents it), then the same exchange.
//!
//! Invariants:
//! - Each exchange (TLS handshake included) is bounded by
//!   `net.handshake_timeout_ms` and costs only its own task; a follower
//!   never reads more than one handshake's frames.

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::codec::encode_method;
use berth_protocol::frame::{decode_frame, FRAME_MIN_SIZE, PROTOCOL_HEADER};
use berth_protocol::methods::connection as conn;
use berth_protocol::reply::CONNECTION_FORCED;
use berth_protocol::{AMQPClass, FieldTable};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::view::ClusterView;

/// Turns away every connection on `listener` until the task is aborted;
/// with `tls`, after a TLS handshake (an AMQPS listener).
pub async fn turn_away(
    listener: TcpListener,
    view: Arc<ClusterView>,
    timeout: Duration,
    tls: Option<TlsAcceptor>,
) {
    let kind = if tls.is_some() { "amqps" } else { "amqp" };
    loop {
        let (stream, peer) = crate::listen::accept(&listener, kind).await;
        let text = format!(
            "CONNECTION_FORCED - {}",
            view.not_leader_text(|s| format!("amqp {}", s.amqp))
        );
        let tls = tls.clone();
        tokio::spawn(async move {
            let answered = tokio::time::timeout(timeout, async {
                match tls {
                    None => exchange(stream, &text).await,
                    Some(acceptor) => exchange(acceptor.accept(stream).await?, &text).await,
                }
            });
            match answered.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a turned-away client left"),
                Err(_) => {
                    tracing::debug!(%peer, "a turned-away client did not finish the handshake in time")
                }
            }
        });
    }
}

async fn exchange<S>(mut stream: S, text: &str) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).await?;
    if header != PROTOCOL_HEADER {
        return stream.write_all(&PROTOCOL_HEADER).await;
    }
    let mut out = BytesMut::new();
    encode_method(
        &mut out,
        0,
        &AMQPClass::Connection(conn::AMQPMethod::Start(conn::Start {
            version_major: 0,
            version_minor: 9,
            server_properties: FieldTable::default(),
            mechanisms: "PLAIN AMQPLAIN".into(),
            locales: "en_US".into(),
        })),
    );
    stream.write_all(&out).await?;
    // start-ok, then tune / tune-ok and open: three frames.
    let mut buf = BytesMut::with_capacity(1024);
    for step in 0..3 {
        loop {
            match decode_frame(&mut buf, FRAME_MIN_SIZE) {
                Ok(Some(_)) => break,
                Ok(None) => {
                    if stream.read_buf(&mut buf).await? == 0 {
                        return Ok(());
                    }
                }
                Err(_) => return Ok(()),
            }
        }
        if step == 0 {
            out.clear();
            encode_method(
                &mut out,
                0,
                &AMQPClass::Connection(conn::AMQPMethod::Tune(conn::Tune {
                    channel_max: 1,
                    frame_max: FRAME_MIN_SIZE,
                    heartbeat: 0,
                })),
            );
            stream.write_all(&out).await?;
        }
    }
    out.clear();
    encode_method(
        &mut out,
        0,
        &AMQPClass::Connection(conn::AMQPMethod::Close(conn::Close {
            reply_code: CONNECTION_FORCED,
            reply_text: text.into(),
            class_id: 0,
            method_id: 0,
        })),
    );
    stream.write_all(&out).await?;
    // Give the client a moment to read the close and answer close-ok.
    let mut rest = [0u8; 256];
    let _ = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut rest)).await;
    Ok(())
}
