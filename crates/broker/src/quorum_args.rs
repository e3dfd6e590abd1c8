//! The placement arguments of a quorum queue, `x-quorum-initial-group-size`
//! and `x-queue-leader-locator`: checked as RabbitMQ 3.10 checks them, and
//! refused with 540 NOT_IMPLEMENTED where berth cannot do what they ask.
//! berth keeps every quorum queue on every member of the cluster (one
//! Raft group replicates the whole broker), led by that group's leader,
//! which is the member every client is connected to.
//!
//! Invariants:
//! - A group size is a positive integer; one at least the number of
//!   members is honoured (RabbitMQ caps it at the cluster's size), a
//!   smaller one is refused (540): berth cannot keep fewer copies.
//! - A leader locator is `client-local` (what happens: the queue's leader
//!   is the member the client is connected to) or `balanced` (honoured on
//!   one node, refused with 540 in a cluster, where leaders cannot be
//!   spread yet); any other value is refused with 406, as RabbitMQ does.

use berth_protocol::FieldTable;

use crate::args::{as_i128, as_string, type_name};
use crate::error::{AmqpError, AmqpResult};

pub const GROUP_SIZE: &str = "x-quorum-initial-group-size";
pub const LEADER_LOCATOR: &str = "x-queue-leader-locator";

/// Checks a quorum queue's placement arguments in `table`, for a journal
/// that keeps each write on `copies` members.
pub fn check(queue: &str, vhost: &str, table: &FieldTable, copies: u32) -> AmqpResult<()> {
    let invalid = |key: &str, why: String| {
        AmqpError::precondition_failed(format!(
            "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {why}"
        ))
    };
    if let Some(v) = table.inner().get(GROUP_SIZE) {
        let size = as_i128(v).ok_or_else(|| {
            invalid(
                GROUP_SIZE,
                format!("{{unacceptable_type,{}}}", type_name(v)),
            )
        })?;
        if size < 1 {
            return Err(invalid(
                GROUP_SIZE,
                format!("{{value_zero_or_less,{size}}}"),
            ));
        }
        if size < i128::from(copies) {
            return Err(AmqpError::not_implemented(format!(
                "{GROUP_SIZE} {size} for queue '{queue}' in vhost '{vhost}': berth keeps every quorum queue on all {copies} members of the cluster; leave the argument out or give at least {copies}"
            )));
        }
    }
    if let Some(v) = table.inner().get(LEADER_LOCATOR) {
        let locator = as_string(v).ok_or_else(|| {
            invalid(
                LEADER_LOCATOR,
                format!("{{unacceptable_type,{}}}", type_name(v)),
            )
        })?;
        match locator.as_str() {
            "client-local" => {}
            "balanced" if copies <= 1 => {}
            "balanced" => {
                return Err(AmqpError::not_implemented(format!(
                    "{LEADER_LOCATOR} 'balanced' for queue '{queue}' in vhost '{vhost}': every queue is led by the cluster's one Raft leader, so leaders cannot be spread yet; use 'client-local' (the leader is the member you are connected to) or leave the argument out"
                )));
            }
            other => {
                return Err(invalid(
                    LEADER_LOCATOR,
                    format!(
                        "unknown leader locator '{other}', expected 'client-local' or 'balanced'"
                    ),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::AMQPValue;

    fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    fn code(pairs: &[(&str, AMQPValue)], copies: u32) -> Option<u16> {
        check("q", "/", &table(pairs), copies)
            .err()
            .map(|e| e.reply_code)
    }

    /// Both were accepted and ignored: a group of 1 in a cluster of 3
    /// (the queue was on all 3 anyway), and any locator string.
    #[test]
    fn placement_berth_cannot_give_is_refused_not_ignored() {
        let size = |n| (GROUP_SIZE, AMQPValue::LongInt(n));
        let locator = |s: &str| (LEADER_LOCATOR, AMQPValue::LongString(s.into()));
        assert_eq!(code(&[size(1)], 3), Some(540));
        assert_eq!(code(&[size(3)], 3), None);
        assert_eq!(code(&[size(5)], 3), None, "capped at the cluster's size");
        assert_eq!(code(&[size(0)], 1), Some(406));
        assert_eq!(
            code(&[(GROUP_SIZE, AMQPValue::Boolean(true))], 1),
            Some(406)
        );
        assert_eq!(code(&[locator("client-local")], 3), None);
        assert_eq!(code(&[locator("balanced")], 1), None);
        assert_eq!(code(&[locator("balanced")], 3), Some(540));
        assert_eq!(code(&[locator("nearest")], 1), Some(406));
    }
}
