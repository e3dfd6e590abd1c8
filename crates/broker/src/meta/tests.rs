use super::*;

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn binding(to_queue: bool) -> BindingDef {
    BindingDef {
        vhost: "/".into(),
        source: "src".into(),
        to_queue,
        destination: "q1".into(),
        routing_key: "a.#".into(),
        arguments: table(&[("x-match", s("all"))]),
    }
}

fn policy(kind: PolicyKind) -> Policy {
    Policy::new(
        kind,
        "/",
        "p",
        "^q",
        ApplyTo::All,
        3,
        table(&[("max-length", AMQPValue::LongLongInt(2))]),
    )
    .unwrap()
}

/// One command of every kind.
fn every_command() -> Vec<MetaCommand> {
    use MetaCommand as C;
    vec![
        C::PutVhost { name: "v".into() },
        C::DeleteVhost { name: "v".into() },
        C::DefaultsCreated,
        C::PutUser(UserDef {
            name: "u".into(),
            password_hash: Some(PasswordHash::new("secret")),
            tags: vec!["administrator".into(), "monitoring".into()],
        }),
        C::PutUser(UserDef {
            name: "ext".into(),
            password_hash: None,
            tags: vec![],
        }),
        C::DeleteUser { name: "u".into() },
        C::PutPermission(PermissionDef {
            vhost: "/".into(),
            user: "u".into(),
            configure: "^cfg".into(),
            write: ".*".into(),
            read: String::new(),
        }),
        C::DeletePermission {
            vhost: "/".into(),
            user: "u".into(),
        },
        C::PutTopicPermission(TopicPermissionDef {
            vhost: "/".into(),
            user: "u".into(),
            exchange: "amq.topic".into(),
            write: "^{username}".into(),
            read: ".*".into(),
        }),
        C::DeleteTopicPermission {
            vhost: "/".into(),
            user: "u".into(),
            exchange: "amq.topic".into(),
        },
        C::PutPolicy(Box::new(policy(PolicyKind::Policy))),
        C::PutPolicy(Box::new(policy(PolicyKind::Operator))),
        C::DeletePolicy {
            kind: PolicyKind::Operator,
            vhost: "/".into(),
            name: "p".into(),
        },
        C::PutExchange(ExchangeDef {
            vhost: "/".into(),
            name: "x".into(),
            kind: "topic".into(),
            auto_delete: true,
            internal: false,
            arguments: table(&[("alternate-exchange", s("ae"))]),
            delayed_id: None,
        }),
        C::PutExchange(ExchangeDef {
            vhost: "/".into(),
            name: "later".into(),
            kind: "x-delayed-message".into(),
            auto_delete: false,
            internal: false,
            arguments: table(&[("x-delayed-type", s("direct"))]),
            delayed_id: Some(12),
        }),
        C::DeleteExchange {
            vhost: "/".into(),
            name: "x".into(),
        },
        C::PutQueue(QueueDef {
            vhost: "/".into(),
            name: "q1".into(),
            id: 7,
            auto_delete: false,
            arguments: table(&[("x-max-length", AMQPValue::LongLongInt(5))]),
        }),
        C::DeleteQueue {
            vhost: "/".into(),
            name: "q1".into(),
        },
        C::PutBinding(binding(true)),
        C::PutBinding(binding(false)),
        C::DeleteBinding(binding(true)),
    ]
}

#[test]
fn every_command_decodes_back_from_its_encoding() {
    for c in every_command() {
        let (key, value) = c.encode();
        assert_eq!(MetaCommand::decode(&key, value.as_deref()), Ok(c));
    }
}

#[test]
fn a_malformed_key_is_refused_with_its_parts_named() {
    let e = MetaCommand::decode(b"q\0/", Some(b"")).unwrap_err();
    assert_eq!(e, r#"["q", "/"]: malformed key"#);
    let e = MetaCommand::decode(b"q\0/\0q1", Some(b"\x01")).unwrap_err();
    assert!(e.ends_with("value is not a field table"), "{e}");
}

#[test]
fn keys_split_back_into_their_parts() {
    let (k, _) = MetaCommand::PutBinding(BindingDef {
        arguments: FieldTable::default(),
        ..binding(true)
    })
    .encode();
    let parts = split_key(&k);
    assert_eq!(&parts[..6], ["b", "/", "src", "q", "q1", "a.#"]);
}

/// docs/FORMAT.md, "Metadata values": a durable queue's definition.
#[test]
fn golden_bytes_queue_definition() {
    let (k, v) = MetaCommand::PutQueue(QueueDef {
        vhost: "/".into(),
        name: "q1".into(),
        id: 7,
        auto_delete: false,
        arguments: FieldTable::default(),
    })
    .encode();
    assert_eq!(k, b"q\0/\0q1");
    let mut expected: Vec<u8> = vec![0, 0, 0, 41]; // table length, u32 BE
    expected.extend_from_slice(b"\x09arguments"); // keys sorted, shortstr
    expected.extend_from_slice(&[b'F', 0, 0, 0, 0]); // empty table
    expected.extend_from_slice(b"\x0bauto_delete");
    expected.extend_from_slice(&[b't', 0]); // boolean false
    expected.extend_from_slice(b"\x02id");
    expected.extend_from_slice(&[b'l', 0, 0, 0, 0, 0, 0, 0, 7]); // i64 BE
    assert_eq!(v.unwrap(), expected);
    assert_eq!(queue_id_of(&expected), Some(7));
}

/// docs/FORMAT.md, "Metadata keys" and "values": a stored policy.
#[test]
fn golden_bytes_policy() {
    let (k, v) = MetaCommand::PutPolicy(Box::new(policy(PolicyKind::Policy))).encode();
    assert_eq!(k, b"y\0/\0p");
    let (k, _) = MetaCommand::PutPolicy(Box::new(policy(PolicyKind::Operator))).encode();
    assert_eq!(k, b"o\0/\0p");
    let v = v.unwrap();
    let mut expected: Vec<u8> = vec![0, 0, 0, 0x56]; // table length, u32 BE
    expected.extend_from_slice(b"\x08apply-to");
    expected.extend_from_slice(b"S\0\0\0\x03all");
    expected.extend_from_slice(b"\x0adefinition");
    expected.extend_from_slice(b"F\0\0\0\x14"); // nested table, 20 bytes
    expected.extend_from_slice(b"\x0amax-length");
    expected.extend_from_slice(&[b'l', 0, 0, 0, 0, 0, 0, 0, 2]);
    expected.extend_from_slice(b"\x07pattern");
    expected.extend_from_slice(b"S\0\0\0\x02^q");
    expected.extend_from_slice(b"\x08priority");
    expected.extend_from_slice(&[b'l', 0, 0, 0, 0, 0, 0, 0, 3]);
    assert_eq!(v, expected);
    let MetaCommand::PutPolicy(back) = MetaCommand::decode(&k, Some(&v)).unwrap() else {
        panic!("a policy");
    };
    assert_eq!(back.priority, 3);
    assert_eq!(back.settings.max_length, Some(2));
}

/// docs/FORMAT.md, "Metadata keys": the keys without a golden test of
/// their own above.
#[test]
fn golden_bytes_other_keys() {
    let key = |c: MetaCommand| c.encode().0;
    let cmds = every_command();
    let want: [&[u8]; 6] = [
        b"v\0v",
        b"d",
        b"u\0u",
        b"p\0/\0u",
        b"t\0/\0u\0amq.topic",
        b"x\0/\0x",
    ];
    let got = [
        key(cmds[0].clone()),
        key(cmds[2].clone()),
        key(cmds[3].clone()),
        key(cmds[6].clone()),
        key(cmds[8].clone()),
        key(cmds[13].clone()),
    ];
    assert_eq!(got.map(|k| k.to_vec()), want.map(<[u8]>::to_vec));
    let (k, v) = MetaCommand::PutVhost { name: "v".into() }.encode();
    assert_eq!(
        (k.len(), v),
        (3, Some(Vec::new())),
        "a vhost has an empty value"
    );
}

/// Commands whose every name is `n` (a vhost, user, exchange, queue,
/// binding end or routing key): one of each key kind.
fn commands_named(n: &str) -> Vec<MetaCommand> {
    use MetaCommand as C;
    let b = BindingDef {
        vhost: n.into(),
        source: n.into(),
        to_queue: true,
        destination: n.into(),
        routing_key: n.into(),
        arguments: table(&[("x-match", s("all"))]),
    };
    vec![
        C::PutVhost { name: n.into() },
        C::DeleteUser { name: n.into() },
        C::DeletePermission {
            vhost: n.into(),
            user: n.into(),
        },
        C::DeleteTopicPermission {
            vhost: n.into(),
            user: n.into(),
            exchange: n.into(),
        },
        C::DeletePolicy {
            kind: PolicyKind::Operator,
            vhost: n.into(),
            name: n.into(),
        },
        C::PutExchange(ExchangeDef {
            vhost: n.into(),
            name: n.into(),
            kind: "direct".into(),
            auto_delete: false,
            internal: false,
            arguments: FieldTable::default(),
            delayed_id: None,
        }),
        C::PutQueue(QueueDef {
            vhost: n.into(),
            name: n.into(),
            id: 3,
            auto_delete: false,
            arguments: FieldTable::default(),
        }),
        C::DeleteQueue {
            vhost: n.into(),
            name: n.into(),
        },
        C::PutBinding(b.clone()),
        C::DeleteBinding(b),
    ]
}

/// Issue 16: a zero byte in a name used to add a part to the key, so the
/// definition was skipped as malformed at restore and its messages were
/// stranded.
#[test]
fn a_name_with_a_zero_byte_decodes_back_unchanged() {
    for n in ["odd\0name", "\0", "\0\0", "a\0", "\0b"] {
        for c in commands_named(n) {
            let (key, value) = c.encode();
            assert_eq!(MetaCommand::decode(&key, value.as_deref()), Ok(c));
        }
    }
}

/// docs/FORMAT.md, "Metadata keys": a key with a zero byte in a name is
/// length-prefixed.
#[test]
fn golden_bytes_length_prefixed_key() {
    let (k, _) = MetaCommand::DeleteQueue {
        vhost: "/".into(),
        name: "a\0b".into(),
    }
    .encode();
    let expected: &[u8] = &[
        0xFF, // length-prefixed
        0, 0, 0, 1, b'q', // kind
        0, 0, 0, 1, b'/', // vhost
        0, 0, 0, 3, b'a', 0, b'b', // name
    ];
    assert_eq!(k, expected);
}

#[test]
fn a_length_prefixed_key_that_ends_early_or_needs_no_prefix_is_refused() {
    let (k, _) = MetaCommand::DeleteQueue {
        vhost: "/".into(),
        name: "a\0b".into(),
    }
    .encode();
    for cut in 1..k.len() {
        let e = MetaCommand::decode(&k[..cut], None).unwrap_err();
        assert!(
            e.contains("ends inside") || e.contains("without a zero byte"),
            "cut at {cut}: {e}"
        );
    }
    // `q` · `/` · `q1` spelled length-prefixed: a second key for the
    // same queue, which berth never writes.
    let e = MetaCommand::decode(b"\xff\0\0\0\x01q\0\0\0\x01/\0\0\0\x02q1", None).unwrap_err();
    assert!(e.contains("without a zero byte"), "{e}");
}

fn any_name() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let ch = prop_oneof![
        Just('\0'),
        Just('a'),
        Just('.'),
        Just('é'),
        Just('€'),
        Just('𝄞'),
        Just('\u{FF}'),
        any::<char>(),
    ];
    proptest::collection::vec(ch, 0..90).prop_map(|v| v.into_iter().collect())
}

proptest::proptest! {
    /// Whatever the names, a command decodes back from its key unchanged.
    #[test]
    fn any_names_decode_back_unchanged(n in any_name()) {
        for c in commands_named(&n) {
            let (key, value) = c.encode();
            proptest::prop_assert_eq!(MetaCommand::decode(&key, value.as_deref()), Ok(c));
        }
    }

    /// Bytes that are not a key give an error, never a panic.
    #[test]
    fn any_bytes_decode_or_fail_without_panicking(
        key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
    ) {
        let _ = MetaCommand::decode(&key, None);
        let _ = MetaCommand::decode(&key, Some(b""));
    }
}

#[test]
fn the_kind_of_a_key_is_read_from_either_spelling() {
    for n in ["q1", "a\0b"] {
        let (k, _) = MetaCommand::DeleteQueue {
            vhost: "/".into(),
            name: n.into(),
        }
        .encode();
        assert_eq!(key_kind(&k), Some(b'q'), "{k:?}");
    }
    assert_eq!(key_kind(b""), None);
    assert_eq!(key_kind(b"\xff\0\0\0\x02qq"), None);
}
