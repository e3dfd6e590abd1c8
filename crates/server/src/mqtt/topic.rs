//! MQTT topic names and filters as AMQP routing and binding keys on
//! `amq.topic`, as RabbitMQ's MQTT plugin maps them: `/` ↔ `.`,
//! `+` ↔ `*`, `#` ↔ `#`. A `.` inside an MQTT level becomes `/` (and back),
//! so the mapping is its own inverse and no two topics share a key.
//!
//! Invariants:
//! - A topic name (PUBLISH) has no wildcard and is not empty; a filter
//!   (SUBSCRIBE) has `+` only as a whole level and `#` only as the whole
//!   last level (MQTT 3.1.1 §4.7, 5.0 §4.7); anything else is refused
//!   here, before it reaches the broker.

/// Why a topic name or filter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("empty topic")]
    Empty,
    #[error("topic name with a wildcard ('+' or '#')")]
    WildcardInName,
    #[error("'{0}' must be a whole level of a topic filter")]
    PartialWildcard(char),
    #[error("'#' must be the last level of a topic filter")]
    HashNotLast,
    #[error("topic contains U+0000")]
    Nul,
}

/// Swaps `/` and `.`: the one character mapping both ways.
fn swap_separators(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '/' => '.',
            '.' => '/',
            c => c,
        })
        .collect()
}

/// The routing key of a PUBLISH's topic name.
pub fn routing_key(name: &str) -> Result<String, TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.contains('\0') {
        return Err(TopicError::Nul);
    }
    if name.contains(['+', '#']) {
        return Err(TopicError::WildcardInName);
    }
    Ok(swap_separators(name))
}

/// The binding key of a SUBSCRIBE's topic filter.
pub fn binding_key(filter: &str) -> Result<String, TopicError> {
    if filter.is_empty() {
        return Err(TopicError::Empty);
    }
    if filter.contains('\0') {
        return Err(TopicError::Nul);
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        for wildcard in ['+', '#'] {
            if level.contains(wildcard) && level.len() != 1 {
                return Err(TopicError::PartialWildcard(wildcard));
            }
        }
        if *level == "#" && i + 1 != levels.len() {
            return Err(TopicError::HashNotLast);
        }
    }
    Ok(levels
        .iter()
        .map(|level| match *level {
            "+" => "*".to_owned(),
            l => swap_separators(l),
        })
        .collect::<Vec<_>>()
        .join("."))
}

/// The MQTT topic name of a message's routing key (what a subscriber is
/// told the message was published to).
pub fn topic_name(routing_key: &str) -> String {
    swap_separators(routing_key)
}

/// Whether topic name `name` matches topic `filter` (MQTT 3.1.1 §4.7,
/// 5.0 §4.7.2: a wildcard at the first level does not match a name
/// starting with `$`). `filter` is one [`binding_key`] accepts.
pub fn matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut names = name.split('/');
    for level in filter.split('/') {
        match (level, names.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (l, Some(n)) if l == n => {}
            _ => return false,
        }
    }
    names.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_names_as_mqtt_says() {
        assert!(matches("a/+/c", "a/b/c"));
        assert!(matches("a/#", "a"), "'#' matches the parent level too");
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a/b"));
        assert!(matches("+/+", "/b"), "an empty level is a level");
        assert!(!matches("a/+", "a/b/c"));
        assert!(!matches("a/b", "a"));
        assert!(!matches("#", "$SYS/x"), "wildcards skip $ topics");
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
    }

    #[test]
    fn separators_and_wildcards_map_as_rabbitmq_does() {
        assert_eq!(routing_key("a/b/c").unwrap(), "a.b.c");
        assert_eq!(binding_key("a/+/c").unwrap(), "a.*.c");
        assert_eq!(binding_key("a/#").unwrap(), "a.#");
        assert_eq!(binding_key("#").unwrap(), "#");
        assert_eq!(topic_name("a.b.c"), "a/b/c");
    }

    #[test]
    fn a_dot_in_a_level_survives_the_round_trip() {
        let key = routing_key("v1.2/temp").unwrap();
        assert_eq!(key, "v1/2.temp");
        assert_eq!(topic_name(&key), "v1.2/temp");
    }

    #[test]
    fn wildcards_in_names_and_partial_wildcards_are_refused() {
        assert_eq!(routing_key("a/+"), Err(TopicError::WildcardInName));
        assert_eq!(routing_key(""), Err(TopicError::Empty));
        assert_eq!(binding_key("a/b+"), Err(TopicError::PartialWildcard('+')));
        assert_eq!(binding_key("a/#/b"), Err(TopicError::HashNotLast));
        assert_eq!(binding_key("a#"), Err(TopicError::PartialWildcard('#')));
        assert_eq!(binding_key(""), Err(TopicError::Empty));
    }
}
