//! The value types settings hold, each read from its text (a flag) and
//! from TOML (`berth.toml`) by one function of its own.
//!
//! Invariants:
//! - A type is parsed in one place: a flag's text and a TOML string go
//!   through the same [`Value::from_text`]; TOML numbers and booleans are
//!   checked by serde against the same Rust type the flag parses into, so a
//!   value one source accepts the other accepts too.
//! - An error names what was expected, in serde's words where serde's
//!   words were used before (`unknown variant ..., expected one of ...`).

use std::path::PathBuf;

use crate::cert_login::{LoginFrom, SanType};
use crate::config::SyncMode;
use crate::mechanism::Mechanism;

/// A setting's value type.
pub trait Value: Sized + Clone + Send + Sync + 'static {
    /// From a flag's text.
    fn from_text(text: &str) -> Result<Self, String>;

    /// From a `berth.toml` value.
    fn from_toml(value: toml::Value) -> Result<Self, String>;

    /// As written in docs/CONFIG.md's default column.
    fn show(&self) -> String;

    /// The names an enumerated type accepts, for `--help`; empty otherwise.
    fn names() -> &'static [&'static str] {
        &[]
    }
}

/// serde's own reading of a TOML value, keeping its message (`invalid
/// type: string "x", expected u16`).
fn deserialize<T: serde::de::DeserializeOwned>(value: toml::Value) -> Result<T, String> {
    T::deserialize(value).map_err(|e| e.message().to_owned())
}

/// A TOML string, then its text.
fn from_toml_string<T: Value>(value: toml::Value) -> Result<T, String> {
    T::from_text(&deserialize::<String>(value)?)
}

macro_rules! numbers {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn from_text(text: &str) -> Result<Self, String> {
                text.parse().map_err(|e: std::num::ParseIntError| e.to_string())
            }
            fn from_toml(value: toml::Value) -> Result<Self, String> {
                deserialize(value)
            }
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

numbers!(u16, u32, u64, usize);

impl Value for bool {
    fn from_text(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|e: std::str::ParseBoolError| format!("{e}: expected true or false"))
    }
    fn from_toml(value: toml::Value) -> Result<Self, String> {
        deserialize(value)
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl Value for String {
    fn from_text(text: &str) -> Result<Self, String> {
        Ok(text.to_owned())
    }
    fn from_toml(value: toml::Value) -> Result<Self, String> {
        deserialize(value)
    }
    fn show(&self) -> String {
        self.clone()
    }
}

impl Value for PathBuf {
    fn from_text(text: &str) -> Result<Self, String> {
        // As clap's path parser did: an empty path is a mistake, not ".".
        if text.is_empty() {
            return Err("a path cannot be empty".into());
        }
        Ok(PathBuf::from(text))
    }
    fn from_toml(value: toml::Value) -> Result<Self, String> {
        deserialize(value)
    }
    fn show(&self) -> String {
        self.display().to_string()
    }
}

/// serde's wording for a `what` (variant, field) named `name` that is not
/// one of `expected`.
pub(super) fn unknown(what: &str, name: &str, expected: &[&str]) -> String {
    let expected: Vec<String> = expected.iter().map(|n| format!("`{n}`")).collect();
    format!(
        "unknown {what} `{name}`, expected one of {}",
        expected.join(", ")
    )
}

impl Value for SyncMode {
    fn from_text(text: &str) -> Result<Self, String> {
        match text {
            "always" => Ok(SyncMode::Always),
            "interval" => Ok(SyncMode::Interval),
            "never" => Ok(SyncMode::Never),
            _ => Err(unknown("variant", text, Self::names())),
        }
    }
    fn from_toml(value: toml::Value) -> Result<Self, String> {
        from_toml_string(value)
    }
    fn show(&self) -> String {
        match self {
            SyncMode::Always => "always",
            SyncMode::Interval => "interval",
            SyncMode::Never => "never",
        }
        .into()
    }
    fn names() -> &'static [&'static str] {
        &["always", "interval", "never"]
    }
}

/// A type with a name per value, read by its own `FromStr` (which knows
/// its aliases); `$name` is how the docs show each value.
macro_rules! named {
    ($t:ty { $($variant:path => $name:literal),* $(,)? }) => {
        impl Value for $t {
            fn from_text(text: &str) -> Result<Self, String> {
                text.parse()
            }
            fn from_toml(value: toml::Value) -> Result<Self, String> {
                from_toml_string(value)
            }
            fn show(&self) -> String {
                match self {
                    $($variant => $name,)*
                }
                .into()
            }
        }
    };
}

named!(LoginFrom {
    LoginFrom::CommonName => "common_name",
    LoginFrom::DistinguishedName => "distinguished_name",
    LoginFrom::SubjectAlternativeName => "subject_alternative_name",
});

named!(SanType {
    SanType::Dns => "dns",
    SanType::Email => "email",
    SanType::Uri => "uri",
    SanType::OtherName => "other_name",
});

named!(Mechanism {
    Mechanism::Plain => "PLAIN",
    Mechanism::Amqplain => "AMQPLAIN",
    Mechanism::External => "EXTERNAL",
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Every enumerated value shown in the docs reads back as itself, from
    /// a flag and from TOML alike.
    fn round_trips<T: Value + PartialEq + std::fmt::Debug>(all: &[T]) {
        for v in all {
            assert_eq!(&T::from_text(&v.show()).unwrap(), v);
            assert_eq!(&T::from_toml(toml::Value::String(v.show())).unwrap(), v);
        }
    }

    #[test]
    fn enumerated_values_read_back_by_the_name_they_are_shown_with() {
        round_trips(&[SyncMode::Always, SyncMode::Interval, SyncMode::Never]);
        round_trips(&[
            LoginFrom::CommonName,
            LoginFrom::DistinguishedName,
            LoginFrom::SubjectAlternativeName,
        ]);
        round_trips(&Mechanism::ALL);
        round_trips(&[
            SanType::Dns,
            SanType::Email,
            SanType::Uri,
            SanType::OtherName,
        ]);
        assert_eq!(
            LoginFrom::from_text("subject_alt_name").unwrap(),
            LoginFrom::SubjectAlternativeName
        );
    }

    #[test]
    fn numbers_out_of_their_type_are_refused_from_either_source() {
        assert!(u16::from_text("70000").is_err());
        let e = u16::from_toml(toml::Value::Integer(70_000)).unwrap_err();
        assert!(e.contains("u16"), "{e}");
        let e = u16::from_toml(toml::Value::String("5".into())).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        assert!(bool::from_text("yes").is_err());
        assert!(PathBuf::from_text("").is_err());
    }
}
