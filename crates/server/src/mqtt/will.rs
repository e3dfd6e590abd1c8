//! A client's will message: checked when it connects (the topic and the
//! publish permission, so a will that could never be published refuses
//! the CONNECT instead of failing silently later) and published to
//! `amq.topic` when the connection ends without a DISCONNECT (or with v5
//! reason 0x04), like any PUBLISH of the client.
//!
//! Invariants:
//! - A will is published at most once, and never after a normal
//!   DISCONNECT or a server shutdown.
//! - v5 will delay: the will waits that long (at most the session's
//!   life) and is dropped if the client id connected again meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_broker::message::Message;
use berth_broker::AmqpResult;
use mqtt5_protocol::packet::publish::PublishPacket;
use mqtt5_protocol::types::WillMessage;

use super::clients::Clients;
use super::retained::Store;
use super::session::{Lifetime, Session};
use super::{publish, topic, EXCHANGE};
use crate::permissions::{authorise, Action};

/// A will, ready to publish.
pub struct Will {
    msg: Arc<Message>,
    /// A retained will: its copy and the vhost's retained store.
    retained: Option<(Arc<Message>, Arc<Store>)>,
    topic: String,
    delay: Option<Duration>,
}

impl Will {
    /// Checks the CONNECT's will: its topic maps and the user may publish
    /// to it.
    pub fn new(
        w: &WillMessage,
        session: &Session,
        user: &str,
        version: u8,
        store: Option<Arc<Store>>,
    ) -> AmqpResult<Self> {
        let key = topic::routing_key(&w.topic).map_err(|e| {
            berth_broker::AmqpError::precondition_failed(format!("will topic: {e}"))
        })?;
        authorise(
            session.shared.broker.access(),
            user,
            &session.vhost,
            Action::Publish {
                exchange: EXCHANGE,
                routing_key: &key,
            },
        )?;
        let mut p = if version == 5 {
            PublishPacket::new(w.topic.clone(), w.payload.clone(), w.qos)
        } else {
            PublishPacket::new_v311(w.topic.clone(), w.payload.clone(), w.qos)
        };
        // Its 5.0 properties, as a PUBLISH would carry them (will delay
        // is the will's own, not the message's).
        w.properties.apply_to_publish_properties(&mut p.properties);
        p.retain = w.retain;
        let msg = publish::message(&p, key, user)?;
        let retained = match store {
            Some(store) if w.retain => Some((publish::retained_copy(&p, user)?, store)),
            _ => None,
        };
        let delay = w
            .properties
            .will_delay_interval
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s)));
        Ok(Self {
            msg,
            retained,
            topic: w.topic.clone(),
            delay,
        })
    }

    /// Publishes the will now, or after its delay unless `client_id`
    /// connected again by then.
    pub fn publish(self, session: &Session, clients: &Arc<Clients>, client_id: &str) {
        let ch = Arc::clone(&session.ch);
        // The will is sent when its delay ends or its session does,
        // whichever comes first (MQTT 5.0 §3.1.3.2.2): a session that
        // ends with its connection sends it at once.
        let delay = match session.lifetime {
            Lifetime::Connection => None,
            Lifetime::ExpiresMs(ms) => self.delay.map(|d| d.min(Duration::from_millis(ms))),
            Lifetime::Forever => self.delay,
        };
        let Some(delay) = delay else {
            route(&ch, &self, session.shared.broker.now());
            return;
        };
        let clients = Arc::clone(clients);
        let (vhost, client_id) = (session.vhost.name.clone(), client_id.to_owned());
        let broker = Arc::clone(&session.shared.broker);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if !clients.is_held(&vhost, &client_id) {
                route(&ch, &self, broker.now());
            }
        });
    }
}

fn route(ch: &berth_broker::channel::Channel, will: &Will, now: Instant) {
    let mut done = || -> berth_broker::durable::Done {
        Box::new(|r| {
            if let Err(e) = r {
                tracing::error!(error = %e, "an MQTT will could not be stored");
            }
        })
    };
    if let Err(e) = ch.publish(EXCHANGE, Arc::clone(&will.msg), false, now, &mut done) {
        tracing::warn!(error = %e.reply_text(), "an MQTT will was not published");
    }
    if let Some((copy, store)) = &will.retained {
        if !store.has_room(&will.topic, copy.body.len()) {
            tracing::warn!(
                "a retained MQTT will was not retained: the retained messages are at their limit"
            );
        } else if let Err(e) = store.retain(Arc::clone(copy), now, &mut done) {
            tracing::warn!(error = %e.reply_text(), "an MQTT will was not retained");
        }
    }
}
