//! The bytes of one replicated journal write: what the leader's broker
//! asked of its journal, as a command every member applies to its own
//! store in log order.
//!
//! ```text
//! tag u8 | fields (integers little-endian)
//! 1 Publish     msg u64 | n u32 | n × queue u64 | payload (rest)
//! 2 Remove      queue u64 | n u32 | n × msg u64
//! 3 Purge       queue u64
//! 4 PutMeta     key_len u32 | key | value (rest)
//! 5 DeleteMeta  key (rest)
//! 6 Announce    name_len u32 | name | amqp_len u32 | amqp | http (rest)
//!               (addresses comma-separated; http empty when off)
//! 7 Member      name (rest): a member's name, so every member can name it
//! 8 Append      queue u64 | offset u64 | payload (rest): a stream's message
//! 9 Trim        queue u64 | below u64: a stream's head leaves
//! ```
//!
//! Invariants:
//! - `decode(encode(c)) == c` for every command (tested); decoding checks
//!   every length against what remains, so a damaged command is an error,
//!   never a panic or a read past the end.

use bytes::Bytes;

/// One replicated write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Publish {
        msg: u64,
        queues: Vec<u64>,
        payload: Bytes,
    },
    Remove {
        queue: u64,
        msgs: Vec<u64>,
    },
    Purge {
        queue: u64,
    },
    PutMeta {
        key: Bytes,
        value: Bytes,
    },
    DeleteMeta {
        key: Bytes,
    },
    /// A member that became leader says where it serves clients, so that
    /// followers can name that address when they turn a client away.
    Announce {
        name: String,
        amqp: String,
        http: String,
    },
    /// A member joins under this name (its Raft id is the name's hash).
    Member {
        name: String,
    },
    /// A stream's message at `offset` (`Store::append`).
    Append {
        queue: u64,
        offset: u64,
        payload: Bytes,
    },
    /// A stream's messages below `below` leave it (`Store::trim`).
    Trim {
        queue: u64,
        below: u64,
    },
}

const PUBLISH: u8 = 1;
const REMOVE: u8 = 2;
const PURGE: u8 = 3;
const PUT_META: u8 = 4;
const DELETE_META: u8 = 5;
const ANNOUNCE: u8 = 6;
const MEMBER: u8 = 7;
const APPEND: u8 = 8;
const TRIM: u8 = 9;

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(
        &u32::try_from(n)
            .expect("lists and keys are bounded far below 4G")
            .to_le_bytes(),
    );
}

fn put_ids(out: &mut Vec<u8>, ids: &[u64]) {
    put_len(out, ids.len());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

impl Command {
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Command::Publish {
                msg,
                queues,
                payload,
            } => {
                out.reserve(1 + 8 + 4 + 8 * queues.len() + payload.len());
                out.push(PUBLISH);
                out.extend_from_slice(&msg.to_le_bytes());
                put_ids(&mut out, queues);
                out.extend_from_slice(payload);
            }
            Command::Remove { queue, msgs } => {
                out.push(REMOVE);
                out.extend_from_slice(&queue.to_le_bytes());
                put_ids(&mut out, msgs);
            }
            Command::Purge { queue } => {
                out.push(PURGE);
                out.extend_from_slice(&queue.to_le_bytes());
            }
            Command::PutMeta { key, value } => {
                out.push(PUT_META);
                put_len(&mut out, key.len());
                out.extend_from_slice(key);
                out.extend_from_slice(value);
            }
            Command::DeleteMeta { key } => {
                out.push(DELETE_META);
                out.extend_from_slice(key);
            }
            Command::Announce { name, amqp, http } => {
                out.push(ANNOUNCE);
                put_len(&mut out, name.len());
                out.extend_from_slice(name.as_bytes());
                put_len(&mut out, amqp.len());
                out.extend_from_slice(amqp.as_bytes());
                out.extend_from_slice(http.as_bytes());
            }
            Command::Member { name } => {
                out.push(MEMBER);
                out.extend_from_slice(name.as_bytes());
            }
            Command::Append {
                queue,
                offset,
                payload,
            } => {
                out.reserve(17 + payload.len());
                out.push(APPEND);
                out.extend_from_slice(&queue.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(payload);
            }
            Command::Trim { queue, below } => {
                out.push(TRIM);
                out.extend_from_slice(&queue.to_le_bytes());
                out.extend_from_slice(&below.to_le_bytes());
            }
        }
        out
    }

    /// Reads a command back; says what is wrong with a damaged one. Its
    /// byte strings (a message's payload) share `bytes`' memory: no copy.
    pub fn decode(bytes: &Bytes) -> Result<Command, String> {
        let shared = |part: &[u8]| bytes.slice_ref(part);
        let mut r = Reader(bytes);
        let tag = r.take(1)?[0];
        let cmd = match tag {
            PUBLISH => Command::Publish {
                msg: r.u64()?,
                queues: r.ids()?,
                payload: shared(r.rest()),
            },
            REMOVE => Command::Remove {
                queue: r.u64()?,
                msgs: r.ids()?,
            },
            PURGE => Command::Purge { queue: r.u64()? },
            PUT_META => {
                let n = r.len()?;
                Command::PutMeta {
                    key: shared(r.take(n)?),
                    value: shared(r.rest()),
                }
            }
            DELETE_META => Command::DeleteMeta {
                key: shared(r.rest()),
            },
            ANNOUNCE => {
                let n = r.len()?;
                let name = r.text(n)?;
                let n = r.len()?;
                let amqp = r.text(n)?;
                let http = r.text(r.0.len())?;
                Command::Announce { name, amqp, http }
            }
            MEMBER => Command::Member {
                name: r.text(r.0.len())?,
            },
            APPEND => Command::Append {
                queue: r.u64()?,
                offset: r.u64()?,
                payload: shared(r.rest()),
            },
            TRIM => Command::Trim {
                queue: r.u64()?,
                below: r.u64()?,
            },
            other => return Err(format!("unknown command tag {other}")),
        };
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the command", r.0.len()));
        }
        Ok(cmd)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("{} bytes where {n} belong", self.0.len()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn len(&mut self) -> Result<usize, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize)
    }

    fn ids(&mut self) -> Result<Vec<u64>, String> {
        let n = self.len()?;
        if n > self.0.len() / 8 {
            return Err(format!("{n} ids in {} bytes", self.0.len()));
        }
        (0..n).map(|_| self.u64()).collect()
    }

    fn text(&mut self, n: usize) -> Result<String, String> {
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| "announced text that is not UTF-8".to_owned())
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Command> {
        vec![
            Command::Publish {
                msg: 7,
                queues: vec![1, u64::MAX - 1],
                payload: Bytes::from_static(b"body"),
            },
            Command::Remove {
                queue: 3,
                msgs: vec![9, 10],
            },
            Command::Purge { queue: 4 },
            Command::PutMeta {
                key: Bytes::from_static(b"q\0/\0a"),
                value: Bytes::from_static(b"v"),
            },
            Command::DeleteMeta {
                key: Bytes::from_static(b"k"),
            },
            Command::Announce {
                name: "berth1".into(),
                amqp: "127.0.0.1:5672".into(),
                http: String::new(),
            },
            Command::Member {
                name: "berth4".into(),
            },
            Command::Append {
                queue: 5,
                offset: 11,
                payload: Bytes::from_static(b"entry"),
            },
            Command::Trim { queue: 5, below: 3 },
        ]
    }

    #[test]
    fn every_command_reads_back_as_written() {
        for c in every_kind() {
            assert_eq!(Command::decode(&Bytes::from(c.encode())), Ok(c));
        }
    }

    #[test]
    fn a_cut_or_damaged_command_is_an_error_not_a_panic() {
        for c in every_kind() {
            let bytes = c.encode();
            for cut in 0..bytes.len() {
                // A cut inside a variable tail may still decode; it must
                // never panic, and a cut inside the fixed fields must fail.
                let _ = Command::decode(&Bytes::copy_from_slice(&bytes[..cut]));
            }
            // The tag alone lacks the fixed fields of every command but
            // those whose only field is their variable tail.
            let tail_only = matches!(c, Command::DeleteMeta { .. } | Command::Member { .. });
            assert_eq!(
                Command::decode(&Bytes::copy_from_slice(&bytes[..1])).is_err(),
                !tail_only,
                "{c:?}"
            );
        }
        assert!(Command::decode(&Bytes::from_static(&[99]))
            .unwrap_err()
            .contains("unknown"));
        let mut huge = vec![REMOVE];
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Command::decode(&Bytes::from(huge))
            .unwrap_err()
            .contains("ids in"));
    }
}
