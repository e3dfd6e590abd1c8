//! What a shovel definition may hold, and the 400 each mistake gets.

use serde_json::json;

use super::*;

fn minimal() -> Value {
    json!({"src-uri": "amqp://u:p@src:5672/%2f", "src-queue": "a",
           "dest-uri": "amqp://dest", "dest-queue": "b"})
}

fn with(key: &str, v: Value) -> Value {
    let mut m = minimal();
    m[key] = v;
    m
}

fn refused(value: &Value) -> String {
    parse("/", "s", value).expect_err("refused")
}

#[test]
fn a_minimal_definition_takes_rabbitmqs_defaults() {
    let d = parse("/", "s", &minimal()).unwrap();
    assert_eq!(d.src_uris, vec!["amqp://u:p@src:5672/%2f".to_owned()]);
    assert_eq!(d.source, Source::Queue("a".into()));
    assert_eq!(d.destination, Destination::Queue("b".into()));
    assert_eq!(d.ack_mode, AckMode::OnConfirm);
    assert_eq!(d.prefetch_count, 1000);
    assert_eq!(d.delete_after, DeleteAfter::Never);
    assert_eq!(d.reconnect_delay_ms, 1000);
    assert!(!d.add_forward_headers && !d.add_timestamp_header);
    assert_eq!(d.value, minimal());
}

#[test]
fn every_field_berth_runs_is_read() {
    let v = json!({
        "src-uri": ["amqp://a", "amqp://b:5673"], "src-exchange": "x", "src-exchange-key": "k.#",
        "dest-uri": "amqp://d", "dest-exchange": "y", "dest-exchange-key": "rk",
        "ack-mode": "on-publish", "src-prefetch-count": 50, "src-delete-after": 7,
        "reconnect-delay": 2.5, "add-forward-headers": true, "dest-add-timestamp-header": "true",
        "src-protocol": "amqp091", "dest-protocol": "amqp091",
    });
    let d = parse("v", "n", &v).unwrap();
    assert_eq!(d.src_uris.len(), 2);
    assert_eq!(
        d.source,
        Source::Exchange {
            exchange: "x".into(),
            key: "k.#".into()
        }
    );
    assert_eq!(
        d.destination,
        Destination::Exchange {
            exchange: "y".into(),
            key: Some("rk".into())
        }
    );
    assert_eq!(d.ack_mode, AckMode::OnPublish);
    assert_eq!(d.prefetch_count, 50);
    assert_eq!(d.delete_after, DeleteAfter::Count(7));
    assert_eq!(d.reconnect_delay_ms, 2500);
    assert!(d.add_forward_headers && d.add_timestamp_header);
}

#[test]
fn older_names_rabbitmq_still_takes_are_read() {
    let v = json!({"src-uri": "amqp://a", "src-queue": "q", "dest-uri": "amqp://d",
                   "prefetch-count": 9, "delete-after": "queue-length",
                   "dest-add-forward-headers": true});
    let d = parse("/", "s", &v).unwrap();
    assert_eq!(d.prefetch_count, 9);
    assert_eq!(d.delete_after, DeleteAfter::QueueLength);
    assert!(d.add_forward_headers);
    assert_eq!(d.destination, Destination::AsReceived);
}

#[test]
fn an_unknown_field_is_refused_naming_it() {
    let e = refused(&with("dest-queeu", json!("x")));
    assert!(e.contains("dest-queeu is not a shovel field"), "{e}");
}

#[test]
fn fields_rabbitmq_knows_and_berth_does_not_run_are_refused_as_not_yet() {
    for key in NOT_YET {
        let e = refused(&with(key, json!("x")));
        assert!(e.contains("not supported by berth yet"), "{key}: {e}");
    }
    let e = refused(&with("src-protocol", json!("amqp10")));
    assert!(e.contains("AMQP 1.0"), "{e}");
}

#[test]
fn source_and_destination_must_be_one_of_queue_or_exchange() {
    let mut v = minimal();
    v.as_object_mut().unwrap().remove("src-queue");
    assert!(refused(&v).contains("Must specify 'src-exchange' or 'src-queue'"));
    let e = refused(&with("src-exchange", json!("x")));
    assert!(
        e.contains("Cannot specify 'src-exchange' and 'src-queue'"),
        "{e}"
    );
    let e = refused(&with("dest-exchange", json!("x")));
    assert!(
        e.contains("Cannot specify 'dest-exchange' and 'dest-queue'"),
        "{e}"
    );
    let e = refused(&with("dest-exchange-key", json!("k")));
    assert!(
        e.contains("dest-exchange-key cannot be given with dest-queue"),
        "{e}"
    );
    let e = refused(&with("src-queue", json!("q".repeat(256))));
    assert!(e.contains("longer than 255 bytes"), "{e}");
}

#[test]
fn uris_are_required_and_checked() {
    let mut v = minimal();
    v.as_object_mut().unwrap().remove("dest-uri");
    assert!(refused(&v).contains("dest-uri is required"));
    assert!(refused(&with("src-uri", json!([]))).contains("non-empty list"));
    assert!(refused(&with("src-uri", json!(5))).contains("non-empty list"));
    assert!(refused(&with("src-uri", json!("http://h")))
        .contains("must start with amqp:// or amqps://"));
    let e = refused(&with("src-uri", json!("amqp://")));
    assert!(e.contains("names no host"), "{e}");
    let e = refused(&with(
        "dest-uri",
        json!(["amqp://ok", "amqps://u:secret@h"]),
    ));
    assert!(
        e.contains("dest-uri: verify_peer (the default) needs cacertfile"),
        "{e}"
    );
    assert!(!e.contains("secret"), "a password is never echoed: {e}");
    let e = refused(&with("dest-uri", json!("amqps://u:secret@h?verify=maybe")));
    assert!(
        e.contains("verify must be verify_peer or verify_none"),
        "{e}"
    );
    assert!(!e.contains("secret"), "a password is never echoed: {e}");
    let ok = with(
        "dest-uri",
        json!("amqps://u:p@h:5671/%2f?verify=verify_none"),
    );
    parse("/", "s", &ok).expect("amqps:// with verify_none is taken");
    let e = refused(&with("src-uri", json!("amqp://h:notaport")));
    assert!(e.contains("not a valid URI"), "{e}");
}

#[test]
fn numbers_and_modes_are_range_checked() {
    assert!(refused(&with("ack-mode", json!("sometimes"))).contains("ack-mode must be"));
    for bad in [json!(0), json!(65_536), json!(-1), json!("10"), json!(1.5)] {
        let e = refused(&with("src-prefetch-count", bad.clone()));
        assert!(e.contains("from 1 to 65535"), "{bad}: {e}");
    }
    for bad in [json!(-1), json!("soon"), json!(1e9)] {
        let e = refused(&with("reconnect-delay", bad.clone()));
        assert!(e.contains("reconnect-delay must be"), "{bad}: {e}");
    }
    let e = refused(&with("src-delete-after", json!("sometime")));
    assert!(e.contains("should be a number"), "{e}");
    let mut v = with("ack-mode", json!("no-ack"));
    v["src-delete-after"] = json!(10);
    assert!(refused(&v).contains("Cannot specify 'no-ack'"));
    let e = refused(&with("add-forward-headers", json!("yes")));
    assert!(e.contains("must be true or false"), "{e}");
    let zero = parse("/", "s", &with("reconnect-delay", json!(0))).unwrap();
    assert_eq!(zero.reconnect_delay_ms, 0);
}

#[test]
fn a_value_that_is_not_an_object_is_refused() {
    assert!(refused(&json!("amqp://h")).contains("must be a JSON object"));
}

#[test]
fn redact_keeps_the_user_and_drops_the_password() {
    assert_eq!(redact("amqp://u:p@h:1/%2f"), "amqp://u@h:1/%2f");
    assert_eq!(redact("amqp://h/v?heartbeat=5"), "amqp://h/v?heartbeat=5");
    assert_eq!(redact("amqp://u:p:q@h"), "amqp://u@h");
}
