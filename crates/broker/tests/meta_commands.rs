//! Metadata as commands, through the broker's API over an in-memory
//! journal: the commands a broker wrote, replayed in order into a fresh
//! broker (as a replica would) or restored from the journal's final keys
//! (as a restart does), rebuild the same definitions; and a definition
//! change whose write is not durable fails instead of answering `-ok`.

use std::sync::Arc;

use berth_broker::access::{Permission, TopicPermission, User};
use berth_broker::durable::{MemoryJournal, NoJournal};
use berth_broker::exchange::Destination;
use berth_broker::meta::MetaCommand;
use berth_broker::password::PasswordHash;
use berth_broker::policy::{ApplyTo, Policy, PolicyKind};
use berth_broker::vhost::{ExchangeDeclare, QueueDeclare};
use berth_broker::{Broker, Recovered};
use berth_protocol::{AMQPValue, FieldTable};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VHOSTS: [&str; 2] = ["/", "v2"];
const NAMES: [&str; 3] = ["a", "b", "c"];

fn broker_with(journal: &Arc<MemoryJournal>) -> Arc<Broker> {
    Broker::with_journal(["/"], Arc::clone(journal) as _, 1, 1)
}

fn table(key: &str, n: i64) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(key.into(), AMQPValue::LongLongInt(n));
    t
}

/// One random change through the broker's API, as clients and operators
/// make them. Refusals (a missing vhost, an inequivalent redeclare) are
/// part of the stream too: they must leave no command behind.
fn random_change(b: &Broker, rng: &mut StdRng) {
    let vh = VHOSTS[rng.random_range(0..VHOSTS.len())];
    let n = NAMES[rng.random_range(0..NAMES.len())];
    let m = NAMES[rng.random_range(0..NAMES.len())];
    let now = b.now();
    let Some(v) = b.vhost(vh) else {
        b.add_vhost(vh).unwrap();
        return;
    };
    let durable = rng.random_bool(0.7);
    let _refused_or_done = match rng.random_range(0..14) {
        0 => v
            .declare_exchange(
                &format!("x{n}"),
                &ExchangeDeclare {
                    kind: ["direct", "topic", "fanout"][rng.random_range(0..3)].into(),
                    durable,
                    auto_delete: rng.random_bool(0.3),
                    ..ExchangeDeclare::default()
                },
            )
            .is_ok(),
        1 => v.delete_exchange(&format!("x{n}"), false).is_ok(),
        2 | 3 => {
            let d = QueueDeclare {
                durable,
                arguments: table("x-max-length", rng.random_range(1..9)),
                ..QueueDeclare::default()
            };
            v.declare_queue(1, &format!("q{n}"), &d, now).is_ok()
        }
        4 => v.delete_queue(1, &format!("q{n}"), false, false).is_ok(),
        5 | 6 => {
            let args = table("k", rng.random_range(0..2));
            v.bind_queue(1, &format!("q{n}"), &format!("x{m}"), n, &args)
                .is_ok()
        }
        7 => v
            .unbind_queue(
                1,
                &format!("q{n}"),
                &format!("x{m}"),
                n,
                &FieldTable::default(),
            )
            .is_ok(),
        8 => v
            .bind_exchange(
                &format!("x{n}"),
                &format!("x{m}"),
                m,
                &FieldTable::default(),
            )
            .is_ok(),
        9 => {
            let kind = [PolicyKind::Policy, PolicyKind::Operator][rng.random_range(0..2)];
            let def = table("max-length", rng.random_range(0..5));
            let p = Policy::new(kind, vh, n, "^q", ApplyTo::Queues, 1, def).unwrap();
            b.set_policy(p).is_ok()
        }
        10 => b.delete_policy(PolicyKind::Policy, vh, n).is_ok(),
        11 => b
            .access()
            .put_user(User {
                name: n.into(),
                password_hash: Some(PasswordHash::new(m)),
                tags: vec![m.into()],
            })
            .is_ok(),
        12 => {
            let a = b.access();
            let p = Permission::new(n, m, ".*").unwrap();
            let t = TopicPermission {
                exchange: format!("x{m}"),
                write: n.into(),
                read: m.into(),
            };
            a.set_permission(vh, n, p).is_ok() && a.set_topic_permission(vh, n, t).is_ok()
        }
        _ => b.access().delete_user(n).is_ok(),
    };
}

/// The broker's definitions, as text: what survives a restart (durable
/// exchanges and queues, bindings between durable ends, the settings
/// policies give queues, users, permissions, policies).
fn definitions(b: &Broker) -> Vec<String> {
    let mut out = Vec::new();
    for v in b.vhosts() {
        out.push(format!("vhost {}", v.name));
        for e in v.exchanges().iter().filter(|e| e.durable) {
            // The `amq.*` exchanges every vhost has are not stored.
            if !e.name.starts_with("amq.") {
                out.push(format!(
                    "exchange {}/{} {:?} auto_delete={} {:?}",
                    v.name, e.name, e.kind, e.auto_delete, e.arguments
                ));
            }
            for bd in e.bindings() {
                let to = match &bd.destination {
                    Destination::Queue(q) if q.durable => format!("queue {}", q.name),
                    Destination::Exchange(x) if v.exchange(x).is_ok_and(|x| x.durable) => {
                        format!("exchange {x}")
                    }
                    _ => continue, // not stored: one end does not survive a restart
                };
                out.push(format!(
                    "binding {}/{} -> {to} {} {:?}",
                    v.name, e.name, bd.routing_key, bd.arguments
                ));
            }
        }
        for q in v.queues().iter().filter(|q| q.durable) {
            out.push(format!(
                "queue {}/{} id={:?} {:?} {:?}",
                v.name,
                q.name,
                q.store_id,
                q.arguments,
                q.args(),
            ));
        }
        for kind in [PolicyKind::Policy, PolicyKind::Operator] {
            for p in v.policies().map(kind).values() {
                out.push(format!(
                    "policy {kind:?} {}/{} {:?}",
                    v.name, p.name, p.definition
                ));
            }
        }
    }
    let a = b.access();
    for u in a.users() {
        let hash = u.password_hash.as_ref().map(PasswordHash::to_base64);
        out.push(format!("user {} {hash:?} {:?}", u.name, u.tags));
    }
    for (v, u, p) in a.permissions() {
        out.push(format!("permission {v} {u} {:?}", p.configure.source));
    }
    for (v, u, t) in a.topic_permissions() {
        out.push(format!("topic {v} {u} {t:?}"));
    }
    out.sort();
    out
}

/// A fresh broker with `journal`'s final keys restored, as at startup.
fn restored_from(journal: &MemoryJournal) -> Arc<Broker> {
    let b = Broker::with_journal(["/"], Arc::new(NoJournal), 1, 1);
    let meta: Vec<(Vec<u8>, Vec<u8>)> = journal.meta.lock().clone().into_iter().collect();
    let (skipped, _) = b.restore_access(&meta);
    assert!(skipped.is_empty(), "{skipped:?}");
    let recovered = Recovered {
        meta,
        ..Recovered::default()
    };
    let report = b.restore(recovered, b.now());
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    b
}

/// A fresh broker that applied every command `journal` was given, in
/// order, each decoded from its bytes (as a replica would).
fn replayed_from(journal: &MemoryJournal) -> Arc<Broker> {
    let b = Broker::with_journal(["/"], Arc::new(NoJournal), 1, 1);
    for (key, value) in journal.meta_log.lock().iter() {
        let cmd = MetaCommand::decode(key, value.as_deref()).expect("decodes");
        assert_eq!(cmd.encode(), (key.clone(), value.clone()), "one encoding");
        b.apply(&cmd, b.now()).expect("applies");
    }
    b
}

#[test]
fn replaying_the_command_stream_rebuilds_the_same_definitions() {
    for seed in 0..40u64 {
        let journal = Arc::new(MemoryJournal::default());
        let b = broker_with(&journal);
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..120 {
            random_change(&b, &mut rng);
        }
        let want = definitions(&b);
        assert!(want.len() > 3, "seed {seed}: the run defined something");
        assert_eq!(
            definitions(&replayed_from(&journal)),
            want,
            "seed {seed}: replayed"
        );
        assert_eq!(
            definitions(&restored_from(&journal)),
            want,
            "seed {seed}: restored"
        );
    }
}

#[test]
fn a_definition_delete_that_is_not_durable_fails_and_changes_nothing() {
    let journal = Arc::new(MemoryJournal::default());
    let b = broker_with(&journal);
    let v = b.vhost("/").unwrap();
    let now = b.now();
    let durable = QueueDeclare {
        durable: true,
        ..QueueDeclare::default()
    };
    let x = ExchangeDeclare {
        kind: "direct".into(),
        durable: true,
        ..ExchangeDeclare::default()
    };
    v.declare_queue(1, "q", &durable, now).unwrap();
    v.declare_exchange("x", &x).unwrap();
    v.bind_queue(1, "q", "x", "k", &FieldTable::default())
        .unwrap();
    b.add_vhost("v2").unwrap();
    b.access()
        .put_user(User {
            name: "u".into(),
            password_hash: None,
            tags: vec![],
        })
        .unwrap();
    let before = definitions(&b);

    journal.fail_meta_writes(true);
    let e = v.delete_queue(1, "q", false, false).unwrap_err();
    assert_eq!(e.reply_code, 541, "{e:?}");
    assert!(
        e.text.contains("injected failure"),
        "the cause is named: {e:?}"
    );
    v.unbind_queue(1, "q", "x", "k", &FieldTable::default())
        .unwrap_err();
    v.delete_exchange("x", false).unwrap_err();
    b.delete_vhost("v2").unwrap_err();
    b.access().delete_user("u").unwrap_err();
    journal.fail_meta_writes(false);
    let mut after = definitions(&b);
    after.push("vhost v2".into()); // left memory at once; back after a restart
    after.sort();
    assert_eq!(after, before);
    assert_eq!(definitions(&restored_from(&journal)), before);

    // Once the journal works again, so do the deletes.
    assert_eq!(v.delete_queue(1, "q", false, false), Ok(0));
    v.delete_exchange("x", false).unwrap();
    b.access().delete_user("u").unwrap();
    let left: Vec<Vec<u8>> = journal.meta.lock().keys().cloned().collect();
    assert_eq!(
        left,
        [b"v\0v2".to_vec()],
        "only the vhost whose delete failed"
    );
}
