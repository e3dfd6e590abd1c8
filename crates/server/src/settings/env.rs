//! Settings from the environment, for containers and service managers:
//! every key `section.key_name` is also the variable
//! `BERTH_SECTION_KEY_NAME` (`net.amqp_listen` ↔ `BERTH_NET_AMQP_LISTEN`).
//! A variable overrides the file; a flag overrides the variable.
//!
//! Invariants:
//! - A variable's value is parsed by its setting's slot, exactly as the
//!   flag's text is (a list is its items separated by commas, each parsed
//!   as one flag value; an empty value is the empty list), so a value the
//!   flag accepts the variable accepts too.
//! - A bad value is an error naming the variable; a `BERTH_<SECTION>_…`
//!   variable that names no setting is returned to the caller to report
//!   (other tools' `BERTH_` variables share the prefix, so it is not an
//!   error).

use std::ffi::OsString;

use super::slot::Shape;
use super::{all, Setting, SECTIONS};
use crate::config::{Config, ConfigError};

/// What every setting's variable starts with.
pub const ENV_PREFIX: &str = "BERTH_";

impl Setting {
    /// The environment variable of this setting: `BERTH_NET_AMQP_LISTEN`.
    pub fn env_var(&self) -> String {
        format!(
            "{ENV_PREFIX}{}",
            self.key.replace('.', "_").to_ascii_uppercase()
        )
    }
}

/// Puts every setting named by one of `vars` into `config`. Returns the
/// `BERTH_<SECTION>_…` variables that name no setting (a typo, most
/// likely), for the caller to warn about.
pub fn apply(
    config: &mut Config,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Vec<String>, ConfigError> {
    let mut unknown = Vec::new();
    for (name, value) in vars {
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let Some(setting) = all().find(|s| s.env_var() == name) else {
            let lower = rest.to_ascii_lowercase();
            if SECTIONS.iter().any(|s| lower.starts_with(&format!("{s}_"))) {
                unknown.push(name.to_owned());
            }
            continue;
        };
        let invalid = |value: String, why: String| ConfigError::Env {
            var: name.to_owned(),
            value,
            why,
        };
        let Some(text) = value.to_str() else {
            return Err(invalid(
                value.to_string_lossy().into_owned(),
                "not valid UTF-8".into(),
            ));
        };
        set(setting, config, text).map_err(|why| invalid(text.to_owned(), why))?;
    }
    Ok(unknown)
}

/// One variable's text into its setting.
fn set(setting: &Setting, config: &mut Config, text: &str) -> Result<(), String> {
    let slot = setting.slot;
    if slot.shape() != Shape::Repeated {
        let value = slot.parse_flag(text.trim())?;
        slot.set_flag(config, &[value]);
        return Ok(());
    }
    if text.trim().is_empty() {
        return slot.set_toml(config, toml::Value::Array(Vec::new()));
    }
    let values = text
        .split(',')
        .map(|item| slot.parse_flag(item.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    slot.set_flag(config, &values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::SyncMode;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn variables_set_their_keys_over_the_file() {
        let mut c =
            Config::from_toml("[net]\nheartbeat_s = 9\n[store]\nsync = \"never\"\n").unwrap();
        let unknown = apply(
            &mut c,
            vars(&[
                ("BERTH_NET_HEARTBEAT_S", "5"),
                ("BERTH_NET_AMQP_LISTEN", "127.0.0.1:0, [::1]:0"),
                ("BERTH_STORE_DATA_DIRS", "/d"),
                ("BERTH_STORE_RESHAPE", "true"),
                ("BERTH_AUTH_LOOPBACK_USERS", "none"),
                ("BERTH_CLUSTER_PEERS", "a@berth-0.berth.ns.svc:25672,b@h:1"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert_eq!(c.net.heartbeat_s, 5);
        assert_eq!(c.net.amqp_listen, vec!["127.0.0.1:0", "[::1]:0"]);
        assert_eq!(c.store.data_dirs, vec![PathBuf::from("/d")]);
        assert_eq!(
            c.store.sync,
            SyncMode::Never,
            "a key no variable names keeps the file's value"
        );
        assert!(c.store.reshape);
        assert!(c.auth.loopback_users.is_empty());
        assert_eq!(c.cluster.peers.len(), 2);
    }

    #[test]
    fn an_empty_list_variable_empties_the_list() {
        let mut c = Config::default();
        apply(&mut c, vars(&[("BERTH_NET_AMQP_LISTEN", "")])).unwrap();
        assert!(c.net.amqp_listen.is_empty());
    }

    #[test]
    fn a_bad_value_names_the_variable() {
        let mut c = Config::default();
        let e = apply(&mut c, vars(&[("BERTH_STORE_SYNC", "sometimes")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("BERTH_STORE_SYNC") && e.contains("sometimes"),
            "{e}"
        );
        let e = apply(&mut c, vars(&[("BERTH_NET_HEARTBEAT_S", "many")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("BERTH_NET_HEARTBEAT_S"), "{e}");
    }

    #[test]
    fn a_variable_naming_no_setting_is_returned_other_tools_variables_are_not() {
        let mut c = Config::default();
        let unknown = apply(
            &mut c,
            vars(&[
                ("BERTH_NET_HEARTBEAT", "5"),
                ("BERTH_URL", "http://x"),
                ("BERTH_KEEP_TEST_DIRS", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(unknown, vec!["BERTH_NET_HEARTBEAT"]);
        assert_eq!(c, Config::default());
    }

    #[test]
    fn every_setting_has_its_own_variable() {
        let mut seen = std::collections::HashSet::new();
        for s in all() {
            assert!(seen.insert(s.env_var()), "{} shares its variable", s.key);
        }
        assert_eq!(
            super::super::find("limits.connections_max")
                .unwrap()
                .env_var(),
            "BERTH_LIMITS_CONNECTIONS_MAX"
        );
    }
}
