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
