//! AMQP errors as tests assert them: reply codes and texts, and helpers that
//! expect a channel or publish to fail.

use std::future::Future;

use crate::{bounded, try_consume, ConsumerEvent, EVENT_TIMEOUT, SHOW_REPLIES_ENV};

pub use lapin;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel};

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
