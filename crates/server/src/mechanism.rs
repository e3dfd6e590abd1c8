//! The SASL mechanisms berth speaks in `connection.start` / `start-ok`,
//! and which of them a connection is offered: those listed in
//! `auth.mechanisms` (RabbitMQ's `auth_mechanisms`), in that order, with
//! `EXTERNAL` only on a TLS connection whose verified client certificate
//! gives a user name.
//!
//! Invariants:
//! - A client may log in only with a mechanism it was offered: a listed
//!   mechanism the connection cannot use (`EXTERNAL` without a
//!   certificate name) is neither offered nor accepted.

/// A login mechanism (RabbitMQ's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// User and password, `\0user\0password` (RFC 4616).
    Plain,
    /// User and password in an AMQP field table (`LOGIN`, `PASSWORD`).
    Amqplain,
    /// The user named by the client's verified TLS certificate.
    External,
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [Self::Plain, Self::Amqplain, Self::External];

    /// As the wire and the configuration spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Amqplain => "AMQPLAIN",
            Self::External => "EXTERNAL",
        }
    }
}

impl std::str::FromStr for Mechanism {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("expected PLAIN, AMQPLAIN or EXTERNAL, got '{s}'"))
    }
}

/// What a connection is offered, in the configured order.
pub fn offered(listed: &[Mechanism], has_cert_name: bool) -> Vec<Mechanism> {
    listed
        .iter()
        .copied()
        .filter(|m| *m != Mechanism::External || has_cert_name)
        .collect()
}

/// The `mechanisms` field of `connection.start`: names separated by spaces.
pub fn offer_text(offered: &[Mechanism]) -> String {
    offered
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::{offer_text, offered, Mechanism};

    #[test]
    fn external_is_offered_only_when_listed_and_a_certificate_names_the_user() {
        use Mechanism::{Amqplain, External, Plain};
        let default = [Plain, Amqplain];
        assert_eq!(offer_text(&offered(&default, true)), "PLAIN AMQPLAIN");
        let with_external = [External, Plain];
        assert_eq!(offer_text(&offered(&with_external, true)), "EXTERNAL PLAIN");
        assert_eq!(offer_text(&offered(&with_external, false)), "PLAIN");
    }

    #[test]
    fn names_read_back() {
        for m in Mechanism::ALL {
            assert_eq!(m.name().parse::<Mechanism>(), Ok(m));
        }
        assert!("plain".parse::<Mechanism>().is_err());
    }
}
