//! A definitions file exported from RabbitMQ 3.10.8 (`GET /api/definitions`
//! after creating users alice/alice-secret and bob/bob-secret, a vhost,
//! permissions and a topic permission) imports into berth through the
//! function the definitions endpoint calls, and its users log in with their
//! RabbitMQ passwords.

use berth_broker::access::{Perm, Resource};
use berth_broker::Broker;
use berth_server::http::access::{import_access, parse, Imported};

const EXPORT: &str = include_str!("data/rabbitmq-3.10-definitions.json");

#[test]
fn rabbitmq_3_10_export_imports_and_its_users_log_in_with_their_passwords() {
    let broker = Broker::new(["/"]);
    let defs = parse(EXPORT).expect("RabbitMQ's export parses");
    let done = import_access(&broker, &defs).expect("imports");
    assert_eq!(
        done,
        Imported {
            vhosts: 2,
            users: 3,
            permissions: 4,
            topic_permissions: 1,
        }
    );
    let access = broker.access();
    let alice = access
        .authenticate("alice", "alice-secret")
        .expect("alice's RabbitMQ sha256 hash verifies");
    assert_eq!(alice.tags, vec!["management"]);
    assert!(access.authenticate("bob", "bob-secret").is_some());
    assert!(access.authenticate("guest", "guest").is_some());
    assert!(access.authenticate("alice", "bob-secret").is_none());
    assert!(broker.vhost("imported").is_some());
    // alice's permissions and topic permission came along.
    access
        .check(
            "alice",
            "imported",
            Resource::Queue("alice-q"),
            Perm::Configure,
        )
        .unwrap();
    let e = access
        .check(
            "alice",
            "imported",
            Resource::Queue("bob-q"),
            Perm::Configure,
        )
        .unwrap_err();
    assert_eq!(
        e.reply_text(),
        "ACCESS_REFUSED - access to queue 'bob-q' in vhost 'imported' refused for user 'alice'"
    );
    access
        .check_topic(
            "alice",
            "imported",
            "amq.topic",
            "alice.x",
            Perm::Write,
            || true,
        )
        .unwrap();
    assert!(access
        .check_topic(
            "alice",
            "imported",
            "amq.topic",
            "bob.x",
            Perm::Write,
            || true
        )
        .is_err());
    // bob's empty configure pattern grants nothing.
    assert!(access
        .check("bob", "/", Resource::Queue("anything"), Perm::Configure)
        .is_err());
    access
        .check("bob", "/", Resource::Exchange("amq.topic"), Perm::Write)
        .unwrap();
}

#[test]
fn a_bad_hash_refuses_the_whole_import_and_names_the_user() {
    let broker = Broker::new(["/"]);
    let text = r#"{"users":[{"name":"ok","password":"p","tags":""},
        {"name":"broken","password_hash":"AAAA","hashing_algorithm":"rabbit_password_hashing_sha256","tags":""}]}"#;
    let e = import_access(&broker, &parse(text).unwrap()).unwrap_err();
    assert!(e.to_string().contains("user 'broken'"), "{e}");
    assert!(broker.access().user("ok").is_none(), "nothing was stored");
}
