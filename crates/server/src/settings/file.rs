//! Reading `berth.toml` through the settings table.
//!
//! The file is walked with serde's visitors over toml's deserializer (not
//! read into a `toml::Table` first) so that every error, ours included,
//! carries the line and column toml attaches to the value it came from.
//!
//! Invariants:
//! - A key the table does not have, or a section it does not have, is an
//!   error naming it and what was expected, never ignored.
//! - A key's value is read by its setting's slot, the same type the flag
//!   parses into.

use std::fmt;

use serde::de::{DeserializeSeed, Error as _, MapAccess, Visitor};
use serde::Deserialize;

use super::value::unknown;
use super::{all, find, Setting, SECTIONS};
use crate::config::Config;

/// Reads `text` into `config`, over what is already there.
pub(super) fn read(text: &str, config: &mut Config) -> Result<(), toml::de::Error> {
    Table {
        section: None,
        config,
    }
    .deserialize(toml::de::Deserializer::parse(text)?)
}

/// A table of the file: the whole file (a table of sections), or one
/// `[section]` (a table of keys).
struct Table<'c> {
    section: Option<&'static str>,
    config: &'c mut Config,
}

impl<'de> DeserializeSeed<'de> for Table<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Table<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.section {
            None => f.write_str("a table of sections"),
            Some(section) => write!(f, "the table [{section}]"),
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let config = &mut *self.config;
            match self.section {
                None if name == "shovels" => map.next_value_seed(StaticShovels { config })?,
                None => map.next_value_seed(Table {
                    section: Some(known_section(&name).map_err(A::Error::custom)?),
                    config,
                })?,
                Some(section) => map.next_value_seed(Key {
                    setting: known_key(section, &name).map_err(A::Error::custom)?,
                    config,
                })?,
            }
        }
        Ok(())
    }
}

fn known_section(name: &str) -> Result<&'static str, String> {
    if name == "shovel" {
        return Err(
            "`shovel`: static shovels are tables [shovels.NAME] (docs/SHOVELS.md)".to_owned(),
        );
    }
    // RabbitMQ's federation lives in its config files; berth has none yet.
    if name == "federation" {
        return Err("`federation`: federation is not supported by berth yet".to_owned());
    }
    SECTIONS
        .iter()
        .find(|s| **s == name)
        .copied()
        .ok_or_else(|| unknown("field", name, SECTIONS))
}

fn known_key(section: &str, name: &str) -> Result<&'static Setting, String> {
    find(&format!("{section}.{name}")).ok_or_else(|| {
        let expected: Vec<&str> = all()
            .filter(|s| s.section() == section)
            .map(Setting::name)
            .collect();
        unknown("field", name, &expected)
    })
}

/// One key's value, read by its setting.
struct Key<'c> {
    setting: &'static Setting,
    config: &'c mut Config,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let value = toml::Value::deserialize(d)?;
        self.setting
            .slot
            .set_toml(self.config, value)
            .map_err(D::Error::custom)
    }
}

/// The `[shovels]` table: one static shovel per key, each read by
/// [`super::shovels::read`] (the error carries the file's line).
struct StaticShovels<'c> {
    config: &'c mut Config,
}

impl<'de> DeserializeSeed<'de> for StaticShovels<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StaticShovels<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tables [shovels.NAME], one per static shovel")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let table: toml::Value = map.next_value()?;
            let def = super::shovels::read(&name, table).map_err(A::Error::custom)?;
            self.config.shovels.push(def);
        }
        Ok(())
    }
}
