//! Tests of the table and of what is built from it: defaults, the
//! reading of `berth.toml` and the checks.

use std::collections::HashSet;

use super::slot::Shape;
use super::*;
use crate::config::SyncMode;

#[test]
fn empty_file_gives_the_embedded_defaults() {
    assert_eq!(Config::from_toml("").unwrap(), Config::default());
    Config::default().validate().unwrap();
}

#[test]
fn every_message_the_limits_accept_fits_in_one_store_record() {
    let c = Config::default();
    let needed = c.limits.message_size_bytes_max
        + u64::from(c.limits.frame_size_bytes_max)
        + berth_broker::limits::MESSAGE_PAYLOAD_NAMES_BYTES_MAX;
    assert!(
        needed <= u64::from(c.store_config().payload_bytes_max),
        "a {} byte message needs {needed} bytes, the store holds {}",
        c.limits.message_size_bytes_max,
        c.store_config().payload_bytes_max
    );
    let mut c = Config::default();
    c.limits.message_size_bytes_max = 200 << 20;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("limits.message_size_bytes_max") && e.contains("lower one"),
        "{e}"
    );
}

#[test]
fn keys_override_defaults_section_by_section() {
    let c = Config::from_toml(
        "[net]\namqp_listen = [\"127.0.0.1:0\"]\n[limits]\nconsumer_timeout_ms = 5\n",
    )
    .unwrap();
    assert_eq!(c.net.amqp_listen, vec!["127.0.0.1:0"]);
    assert_eq!(c.net.heartbeat_s, 60);
    assert_eq!(c.limits.consumer_timeout_ms, 5);
}

#[test]
fn unknown_keys_are_an_error_not_silently_ignored() {
    let e = Config::from_toml("[net]\nheartbeat = 5\n").unwrap_err();
    assert!(e.to_string().contains("heartbeat"), "{e}");
}

#[test]
fn static_shovels_are_read_from_shovels_tables_with_the_line_of_an_error() {
    let text = "[shovels.orders.source]\nuris = \"amqp://h\"\nqueue = \"in\"\n\
                [shovels.orders.destination]\nuris = \"amqp://h2\"\n";
    let c = Config::from_toml(text).unwrap();
    assert_eq!(c.shovels.len(), 1);
    assert_eq!(c.shovels[0].name, "orders");
    c.validate().unwrap();
    let bad = text.replace("queue = \"in\"", "queue = \"in\"\nprefetch_count = -1");
    let e = Config::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("shovels.orders.source.prefetch_count"), "{e}");
    assert!(e.contains("line"), "{e}");
    let e = Config::from_toml("[shovel.orders]\nsrc_uri = \"amqp://h\"\n").unwrap_err();
    assert!(e.to_string().contains("[shovels.NAME]"), "{e}");
}

#[test]
fn a_static_shovels_unreadable_certificate_file_fails_validation_naming_it() {
    let text = "[shovels.tls.source]\nuris = \"amqp://h\"\nqueue = \"in\"\n\
                [shovels.tls.destination]\n\
                uris = \"amqps://h2?cacertfile=/nonexistent/ca.pem\"\n";
    let e = Config::from_toml(text)
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[shovels.tls]: shovels.tls.destination.uris: cacertfile /nonexistent/ca.pem"),
        "{e}"
    );
}

#[test]
fn bad_listen_address_is_reported_with_the_key() {
    let mut c = Config::default();
    c.net.amqp_listen = vec!["localhost".into()];
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("net.amqp_listen"), "{e}");
}

#[test]
fn sync_mode_is_read_by_its_lowercase_name() {
    let c = Config::from_toml("[store]\nsync = \"interval\"\n").unwrap();
    assert_eq!(c.store.sync, SyncMode::Interval);
    let e = Config::from_toml("[store]\nsync = \"sometimes\"\n").unwrap_err();
    assert!(e.to_string().contains("unknown variant"), "{e}");
}

#[test]
fn frame_max_below_the_amqp_minimum_is_refused() {
    let mut c = Config::default();
    c.limits.frame_size_bytes_max = 100;
    assert!(c.validate().is_err());
}

#[test]
fn checkpoint_journal_bytes_reaches_the_store_and_has_a_floor() {
    let c = Config::from_toml("[store]\ncheckpoint_journal_bytes = 1048576\n").unwrap();
    c.validate().unwrap();
    assert_eq!(c.store_config().checkpoint_journal_bytes, 1_048_576);
    let mut c = Config::default();
    c.store.checkpoint_journal_bytes = 4096;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("store.checkpoint_journal_bytes"), "{e}");
}

#[test]
fn direct_appends_are_on_by_default_and_can_be_turned_off() {
    assert!(Config::default().store_config().direct_appends);
    let c = Config::from_toml("[store]\ndirect_appends = false\n").unwrap();
    c.validate().unwrap();
    assert!(!c.store_config().direct_appends);
}

#[test]
fn segment_prepare_is_on_by_default_and_can_be_turned_off() {
    assert!(Config::default().store_config().segment_prepare);
    let c = Config::from_toml("[store]\nsegment_prepare = false\n").unwrap();
    c.validate().unwrap();
    assert!(!c.store_config().segment_prepare);
}

#[test]
fn segment_cache_bytes_reaches_the_store_and_zero_turns_it_off() {
    assert_eq!(
        Config::default().store_config().segment_cache_bytes,
        berth_store::limits::SEGMENT_CACHE_BYTES_DEFAULT
    );
    let c = Config::from_toml("[store]\nsegment_cache_bytes = 0\n").unwrap();
    c.validate().unwrap();
    assert_eq!(c.store_config().segment_cache_bytes, 0);
    let c = Config::from_toml("[store]\nsegment_cache_bytes = 1073741824\n").unwrap();
    assert_eq!(c.store_config().segment_cache_bytes, 1 << 30);
}

#[test]
fn keys_and_flags_are_unique_and_sections_known() {
    let mut keys = HashSet::new();
    let mut flags = HashSet::new();
    for s in all() {
        assert!(keys.insert(s.key), "{} twice", s.key);
        assert!(flags.insert(s.flag), "--{} twice", s.flag);
        assert!(
            SECTIONS.contains(&s.section()),
            "{}: unknown section",
            s.key
        );
        assert!(s.flag != "config", "--config is the file's own flag");
    }
}

/// docs/CONFIG.md's naming rule: `section.key_name` ↔ `--key-name`, the
/// section as a prefix for `[tls]`, `[event_log]` and `[cluster]`, and a plural list in
/// the singular.
#[test]
fn every_flag_follows_the_naming_rule() {
    for s in all() {
        let mut name = s.name().replace('_', "-");
        if matches!(s.section(), "tls" | "event_log" | "cluster") {
            name = format!("{}-{name}", s.section().replace('_', "-"));
        }
        let singular = name
            .strip_suffix('s')
            .filter(|_| s.slot.shape() == Shape::Repeated);
        assert!(
            s.flag == name || Some(s.flag) == singular,
            "{} has the flag --{}",
            s.key,
            s.flag
        );
        assert_eq!(
            s.value_name.is_empty(),
            s.slot.shape() == Shape::Switch,
            "{}: a value name exactly when the flag takes a value",
            s.key
        );
    }
}

#[test]
fn every_default_reads_back_from_the_file() {
    // What the docs show as the default, written in `berth.toml`, is the
    // default: the file, the docs and the defaults agree on each type.
    for s in all() {
        let Some(default) = s.slot.default_text() else {
            continue;
        };
        let value = match s.slot.shape() {
            Shape::Repeated => default.clone(),
            _ => match default.parse::<i64>() {
                Ok(n) => n.to_string(),
                Err(_) if default == "true" || default == "false" => default.clone(),
                Err(_) => format!("{default:?}"),
            },
        };
        let text = format!("[{}]\n{} = {value}\n", s.section(), s.name());
        let c = Config::from_toml(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(c, Config::default(), "{text}");
    }
}

#[test]
fn a_key_in_another_section_is_refused() {
    let e = Config::from_toml("[limits]\nheartbeat_s = 5\n").unwrap_err();
    assert!(e.to_string().contains("heartbeat_s"), "{e}");
    let e = Config::from_toml("[network]\nheartbeat_s = 5\n").unwrap_err();
    assert!(e.to_string().contains("network"), "{e}");
}

#[test]
fn type_errors_in_the_file_name_the_line() {
    let e = Config::from_toml("[net]\nheartbeat_s = \"x\"\n").unwrap_err();
    let e = e.to_string();
    assert!(e.contains("line 2") && e.contains("invalid type"), "{e}");
    let e = Config::from_toml("[net]\nheartbeat_s = 70000\n").unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
}

#[test]
fn flags_parse_with_the_same_type_as_the_file() {
    let mut c = Config::default();
    let sync = find("store.sync").unwrap();
    let v = sync.slot.parse_flag("never").unwrap();
    sync.slot.set_flag(&mut c, &[v]);
    assert_eq!(c.store.sync, SyncMode::Never);
    assert!(sync
        .slot
        .parse_flag("sometimes")
        .unwrap_err()
        .contains("unknown variant"));
    let users = find("auth.loopback_users").unwrap();
    let none = users.slot.parse_flag("none").unwrap();
    users.slot.set_flag(&mut c, &[none]);
    assert!(c.auth.loopback_users.is_empty());
    let dirs = find("store.data_dirs").unwrap();
    let a = dirs.slot.parse_flag("/a").unwrap();
    let b = dirs.slot.parse_flag("/b").unwrap();
    dirs.slot.set_flag(&mut c, &[a, b]);
    assert_eq!(
        c.store.data_dirs,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
}
