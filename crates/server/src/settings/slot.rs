//! Where a setting lives in [`Config`] and how its value gets there: from
//! its default, from `berth.toml`, from its flag, and how it is checked.
//!
//! A slot is typed (it knows its field's Rust type) but the table holds
//! slots as `&dyn Slot`, so one table can list settings of every type.
//!
//! Invariants:
//! - A slot reads and writes exactly one field of [`Config`], the one its
//!   key names ([`field!`] spells the path once for both accessors).
//! - A [`FlagValue`] is made by the `parse_flag` of the slot that later
//!   takes it in `set_flag`; a value of another type there is a bug.

use std::any::Any;
use std::sync::Arc;

use super::value::Value;
use crate::config::Config;

/// How a setting is written on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `--flag VALUE`, at most once.
    Single,
    /// `--flag VALUE`, repeatable: the values given replace the whole list.
    Repeated,
    /// `--flag` without a value: turns the setting on.
    Switch,
}

/// A flag's value, already parsed by its setting's type and carried
/// through clap (which needs values it can clone and share).
#[derive(Clone)]
pub struct FlagValue(Arc<dyn Any + Send + Sync>);

impl FlagValue {
    fn new<T: Any + Send + Sync>(v: T) -> Self {
        Self(Arc::new(v))
    }

    /// The value as `T`.
    fn get<T: Any>(&self) -> &T {
        self.0
            .downcast_ref()
            .expect("a flag value is taken by the slot that parsed it")
    }
}

impl std::fmt::Debug for FlagValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlagValue")
    }
}

/// The word of a repeatable flag that empties its list
/// (`--loopback-user none`).
struct Clear;

/// Why a value is refused: the value as the operator wrote it, and what
/// would be accepted.
#[derive(Debug)]
pub struct Refusal {
    pub value: String,
    pub why: String,
}

impl Refusal {
    pub fn new(value: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            why: why.into(),
        }
    }
}

/// A check of one setting's value, beyond what its type says.
pub type Check<T> = fn(&T) -> Result<(), Refusal>;

/// A setting's place in [`Config`] and how values reach it.
pub trait Slot: Sync {
    fn shape(&self) -> Shape;
    /// Names the flag accepts (an enumerated type's), for `--help`.
    fn names(&self) -> &'static [&'static str];
    /// Puts the default in place.
    fn set_default(&self, config: &mut Config);
    /// The default as docs/CONFIG.md shows it; `None` when unset.
    fn default_text(&self) -> Option<String>;
    fn set_toml(&self, config: &mut Config, value: toml::Value) -> Result<(), String>;
    fn parse_flag(&self, text: &str) -> Result<FlagValue, String>;
    /// Takes the values given to the flag (at least one).
    fn set_flag(&self, config: &mut Config, values: &[FlagValue]);
    fn check(&self, config: &Config) -> Result<(), Refusal>;
}

/// The two accessors of one field of [`Config`].
pub struct Field<T: 'static> {
    pub get: fn(&Config) -> &T,
    pub get_mut: fn(&mut Config) -> &mut T,
}

/// `field!(section.key)`: the accessors of `config.section.key`.
macro_rules! field {
    ($section:ident . $key:ident) => {
        $crate::settings::slot::Field {
            get: |c| &c.$section.$key,
            get_mut: |c| &mut c.$section.$key,
        }
    };
}
pub(crate) use field;

/// What every slot has: its field, the field's default and its check.
pub struct Core<V: 'static> {
    field: Field<V>,
    default: fn() -> V,
    check: Option<Check<V>>,
}

impl<V> Core<V> {
    const fn new(field: Field<V>, default: fn() -> V) -> Self {
        Self {
            field,
            default,
            check: None,
        }
    }

    const fn with_check(self, check: Check<V>) -> Self {
        Self {
            check: Some(check),
            ..self
        }
    }
}

/// What differs between kinds of slot: how the file's and the flag's
/// values become the field's value. Every kind is a [`Slot`] through it.
pub trait Kind: Sync {
    type V: 'static;
    const SHAPE: Shape;
    fn core(&self) -> &Core<Self::V>;
    fn value_names(&self) -> &'static [&'static str];
    /// A value as the docs show it; `None` for "unset".
    fn show(value: &Self::V) -> Option<String>;
    fn read_toml(&self, value: toml::Value) -> Result<Self::V, String>;
    fn read_text(&self, text: &str) -> Result<FlagValue, String>;
    /// The field's value from the values given to the flag (at least one).
    fn read_flags(&self, values: &[FlagValue]) -> Self::V;
}

impl<K: Kind> Slot for K {
    fn shape(&self) -> Shape {
        K::SHAPE
    }
    fn names(&self) -> &'static [&'static str] {
        self.value_names()
    }
    fn set_default(&self, config: &mut Config) {
        let core = self.core();
        *(core.field.get_mut)(config) = (core.default)();
    }
    fn default_text(&self) -> Option<String> {
        K::show(&(self.core().default)())
    }
    fn set_toml(&self, config: &mut Config, value: toml::Value) -> Result<(), String> {
        *(self.core().field.get_mut)(config) = self.read_toml(value)?;
        Ok(())
    }
    fn parse_flag(&self, text: &str) -> Result<FlagValue, String> {
        self.read_text(text)
    }
    fn set_flag(&self, config: &mut Config, values: &[FlagValue]) {
        if !values.is_empty() {
            *(self.core().field.get_mut)(config) = self.read_flags(values);
        }
    }
    fn check(&self, config: &Config) -> Result<(), Refusal> {
        let core = self.core();
        core.check.map_or(Ok(()), |c| c((core.field.get)(config)))
    }
}

/// The last of a flag's values, as `T` (a flag given once has one).
fn last<T: Value>(values: &[FlagValue]) -> T {
    values
        .last()
        .expect("set_flag passes at least one value")
        .get::<T>()
        .clone()
}

/// A setting with one value of type `T` and a default.
pub struct One<T: 'static>(Core<T>);

/// A setting with one value of type `T`.
pub const fn one<T: Value>(field: Field<T>, default: fn() -> T) -> One<T> {
    One(Core::new(field, default))
}

impl<T: Value> One<T> {
    /// The same, with a check on the value.
    pub const fn check(self, check: Check<T>) -> Self {
        let Self(core) = self;
        Self(core.with_check(check))
    }
}

impl<T: Value> Kind for One<T> {
    type V = T;
    const SHAPE: Shape = Shape::Single;
    fn core(&self) -> &Core<T> {
        &self.0
    }
    fn value_names(&self) -> &'static [&'static str] {
        T::names()
    }
    fn show(value: &T) -> Option<String> {
        Some(value.show())
    }
    fn read_toml(&self, value: toml::Value) -> Result<T, String> {
        T::from_toml(value)
    }
    fn read_text(&self, text: &str) -> Result<FlagValue, String> {
        T::from_text(text).map(FlagValue::new)
    }
    fn read_flags(&self, values: &[FlagValue]) -> T {
        last(values)
    }
}

/// An optional setting (a file, say), unset by default.
pub struct Maybe<T: 'static>(Core<Option<T>>);

pub const fn maybe<T: Value>(field: Field<Option<T>>) -> Maybe<T> {
    Maybe(Core::new(field, || None))
}

impl<T: Value> Kind for Maybe<T> {
    type V = Option<T>;
    const SHAPE: Shape = Shape::Single;
    fn core(&self) -> &Core<Option<T>> {
        &self.0
    }
    fn value_names(&self) -> &'static [&'static str] {
        T::names()
    }
    fn show(value: &Option<T>) -> Option<String> {
        value.as_ref().map(Value::show)
    }
    fn read_toml(&self, value: toml::Value) -> Result<Option<T>, String> {
        T::from_toml(value).map(Some)
    }
    fn read_text(&self, text: &str) -> Result<FlagValue, String> {
        T::from_text(text).map(FlagValue::new)
    }
    fn read_flags(&self, values: &[FlagValue]) -> Option<T> {
        Some(last(values))
    }
}

/// A list setting; its flag is repeated once per element.
pub struct List<T: 'static> {
    core: Core<Vec<T>>,
    clear_word: Option<&'static str>,
}

pub const fn list<T: Value>(field: Field<Vec<T>>, default: fn() -> Vec<T>) -> List<T> {
    List {
        core: Core::new(field, default),
        clear_word: None,
    }
}

impl<T: Value> List<T> {
    pub const fn check(self, check: Check<Vec<T>>) -> Self {
        let Self { core, clear_word } = self;
        Self {
            core: core.with_check(check),
            clear_word,
        }
    }

    /// The flag value that stands for the empty list (a flag cannot be
    /// given zero times to mean "none").
    pub const fn cleared_by(self, word: &'static str) -> Self {
        Self {
            clear_word: Some(word),
            ..self
        }
    }
}

impl<T: Value> Kind for List<T> {
    type V = Vec<T>;
    const SHAPE: Shape = Shape::Repeated;
    fn core(&self) -> &Core<Vec<T>> {
        &self.core
    }
    fn value_names(&self) -> &'static [&'static str] {
        T::names()
    }
    fn show(value: &Vec<T>) -> Option<String> {
        let items: Vec<String> = value.iter().map(|v| format!("\"{}\"", v.show())).collect();
        Some(format!("[{}]", items.join(", ")))
    }
    fn read_toml(&self, value: toml::Value) -> Result<Vec<T>, String> {
        let toml::Value::Array(items) = value else {
            return Err(format!(
                "invalid type: {}, expected a sequence",
                value.type_str()
            ));
        };
        items.into_iter().map(T::from_toml).collect()
    }
    fn read_text(&self, text: &str) -> Result<FlagValue, String> {
        if self.clear_word == Some(text) {
            return Ok(FlagValue::new(Clear));
        }
        T::from_text(text).map(FlagValue::new)
    }
    fn read_flags(&self, values: &[FlagValue]) -> Vec<T> {
        if values.iter().any(|v| v.0.is::<Clear>()) {
            return Vec::new();
        }
        values.iter().map(|v| v.get::<T>().clone()).collect()
    }
}

/// A setting off by default whose flag turns it on (`--reshape`).
pub struct Switch(Core<bool>);

pub const fn switch(field: Field<bool>) -> Switch {
    Switch(Core::new(field, || false))
}

impl Kind for Switch {
    type V = bool;
    const SHAPE: Shape = Shape::Switch;
    fn core(&self) -> &Core<bool> {
        &self.0
    }
    fn value_names(&self) -> &'static [&'static str] {
        &[]
    }
    fn show(value: &bool) -> Option<String> {
        Some(value.show())
    }
    fn read_toml(&self, value: toml::Value) -> Result<bool, String> {
        bool::from_toml(value)
    }
    fn read_text(&self, text: &str) -> Result<FlagValue, String> {
        bool::from_text(text).map(FlagValue::new)
    }
    fn read_flags(&self, values: &[FlagValue]) -> bool {
        last(values)
    }
}

/// A check that a list is not empty; `why` says what is needed.
pub fn non_empty<T>(list: &[T], why: &str) -> Result<(), Refusal> {
    if list.is_empty() {
        return Err(Refusal::new("[]", why));
    }
    Ok(())
}
