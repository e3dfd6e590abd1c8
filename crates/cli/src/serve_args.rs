//! The flags of `berth serve`, built at run time from the server's
//! settings table ([`berth_server::settings`]): one flag per setting, with
//! the setting's name, value name, doc and value type, so a flag cannot
//! drift from its `berth.toml` key.
//!
//! Invariants:
//! - A flag's value is parsed by its setting's slot (the same type the
//!   file is read with) while clap reads the command line, so a bad value
//!   is a usage error before anything starts.
//! - Only values typed on the command line are applied: a flag that is not
//!   given leaves the file's value (or the default) alone.

use std::path::PathBuf;

use berth_server::settings::slot::{FlagValue, Shape};
use berth_server::settings::{self, Setting};
use berth_server::Config;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// The id of `--config`, the one flag that is not a setting.
const CONFIG: &str = "config";

/// `berth serve`'s arguments: the configuration file, and the settings
/// given as flags (every flag overrides the `berth.toml` key of the same
/// name; see docs/CONFIG.md).
#[derive(Debug)]
pub struct ServeArgs {
    /// Read settings from this TOML file.
    pub config: Option<PathBuf>,
    matches: ArgMatches,
}

impl ServeArgs {
    /// Puts every setting given as a flag into `config`.
    pub fn apply(&self, config: &mut Config) {
        for setting in settings::all() {
            if self.matches.value_source(setting.key) != Some(ValueSource::CommandLine) {
                continue;
            }
            let values: Vec<FlagValue> = self
                .matches
                .get_many::<FlagValue>(setting.key)
                .map(|v| v.cloned().collect())
                .unwrap_or_default();
            setting.slot.set_flag(config, &values);
        }
    }
}

/// The flag of one setting.
fn flag(setting: &'static Setting) -> Arg {
    let arg = Arg::new(setting.key).long(setting.flag).help(format!(
        "{}: {}",
        setting.key,
        setting.help()
    ));
    let parse = move |text: &str| setting.slot.parse_flag(text);
    let names = setting.slot.names();
    let arg = if names.is_empty() {
        arg.value_parser(parse)
    } else {
        // The names are listed in `--help` and in the error for a wrong one.
        arg.value_parser(PossibleValuesParser::new(names).try_map(move |t| parse(&t)))
    };
    match setting.slot.shape() {
        // A switch takes no value; clap hands "true" to the parser.
        Shape::Switch => arg.action(ArgAction::SetTrue),
        Shape::Single => arg.value_name(setting.value_name).action(ArgAction::Set),
        // The plural (the key's own name) is accepted too: `--cluster-peers`.
        Shape::Repeated => arg
            .value_name(setting.value_name)
            .action(ArgAction::Append)
            // Built once per process for a handful of list settings.
            .alias(&*Box::leak(format!("{}s", setting.flag).into_boxed_str())),
    }
}

impl clap::Args for ServeArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(
            Arg::new(CONFIG)
                .long(CONFIG)
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .env("BERTH_CONFIG")
                .help("Read settings from this TOML file (optional; defaults are embedded)."),
        )
        .args(settings::all().map(flag))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for ServeArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            config: matches.get_one::<PathBuf>(CONFIG).cloned(),
            matches: matches.clone(),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::{FromArgMatches, Parser};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn config(args: &[&str]) -> Result<Config, clap::Error> {
        let matches = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))?;
        let mut c = Config::default();
        ServeArgs::from_arg_matches(&matches)?.apply(&mut c);
        Ok(c)
    }

    #[test]
    fn no_flags_change_nothing() {
        assert_eq!(config(&[]).unwrap(), Config::default());
    }

    #[test]
    fn flags_set_their_keys() {
        let c = config(&[
            "--amqp-listen",
            "127.0.0.1:0",
            "--amqp-listen",
            "[::1]:0",
            "--sync",
            "interval",
            "--heartbeat-s",
            "5",
            "--reshape",
            "--loopback-user",
            "none",
            "--tls-verify-peer",
            "true",
            "--tls-cert-login-from",
            "subject_alt_name",
            "--event-log-enabled",
            "true",
            "--data-dir",
            "/d",
        ])
        .unwrap();
        assert_eq!(c.net.amqp_listen, vec!["127.0.0.1:0", "[::1]:0"]);
        assert_eq!(c.store.sync, berth_server::config::SyncMode::Interval);
        assert_eq!(c.net.heartbeat_s, 5);
        assert!(c.store.reshape && !c.store.accept_missing_segments);
        assert!(c.auth.loopback_users.is_empty());
        assert!(c.tls.verify_peer && c.event_log.enabled);
        assert_eq!(
            c.tls.cert_login_from,
            berth_server::cert_login::LoginFrom::SubjectAlternativeName
        );
        assert_eq!(c.store.data_dirs, vec![PathBuf::from("/d")]);
    }

    #[test]
    fn a_flag_not_given_leaves_the_file_value() {
        let matches = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(["serve", "--heartbeat-s", "7"])
            .unwrap();
        let mut c = Config::from_toml("[store]\nreshape = true\n[net]\nheartbeat_s = 9\n").unwrap();
        ServeArgs::from_arg_matches(&matches).unwrap().apply(&mut c);
        assert!(c.store.reshape);
        assert_eq!(c.net.heartbeat_s, 7);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["--sync", "sometimes"][..],
            &["--heartbeat-s", "70000"],
            &["--tls-verify-peer", "yes"],
            &["--heartbeat-s", "1", "--heartbeat-s", "2"],
        ] {
            let e = config(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }
}
