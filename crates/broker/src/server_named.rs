//! Names the broker makes up: server-named queues.

use rand::Rng;

use crate::limits::SERVER_NAMED_TAIL_CHARS;

/// `amq.gen-` followed by 22 URL-safe base64 characters, as RabbitMQ names
/// server-named queues.
pub(crate) fn server_named() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::rng();
    let tail: String = (0..SERVER_NAMED_TAIL_CHARS)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("amq.gen-{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_named_queues_look_like_rabbitmqs() {
        let a = server_named();
        let tail = a.strip_prefix("amq.gen-").expect("amq.gen- prefix");
        assert_eq!(tail.len(), SERVER_NAMED_TAIL_CHARS);
        assert!(tail
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_ne!(a, server_named(), "random, so two differ");
    }
}
