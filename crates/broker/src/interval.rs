//! RabbitMQ's durations for streams (`x-max-age`, the `max-age` policy
//! key, an `x-stream-offset` interval): a positive integer and one unit,
//! `Y` (365 days), `M` (30 days), `D`, `h`, `m` or `s` — `7D`, `30m`.
//!
//! Invariants:
//! - Anything else (no unit, two units, a sign, spaces, zero) is refused,
//!   never read as something close to it.

const SECOND_MS: u64 = 1000;
const MINUTE_MS: u64 = 60 * SECOND_MS;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// The duration `text` names, in milliseconds; `None` if it is not one.
pub fn parse_ms(text: &str) -> Option<u64> {
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let unit_ms = match unit {
        'Y' => 365 * DAY_MS,
        'M' => 30 * DAY_MS,
        'D' => DAY_MS,
        'h' => HOUR_MS,
        'm' => MINUTE_MS,
        's' => SECOND_MS,
        _ => return None,
    };
    n.checked_mul(unit_ms).filter(|ms| *ms > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_read() {
        assert_eq!(parse_ms("7D"), Some(7 * DAY_MS));
        assert_eq!(parse_ms("30m"), Some(30 * MINUTE_MS));
        assert_eq!(parse_ms("1Y"), Some(365 * DAY_MS));
        assert_eq!(parse_ms("2M"), Some(60 * DAY_MS));
        assert_eq!(parse_ms("12h"), Some(12 * HOUR_MS));
        assert_eq!(parse_ms("5s"), Some(5 * SECOND_MS));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "m",
            "30",
            "-5m",
            "5 m",
            "5x",
            "5mm",
            "0s",
            "1.5h",
            "99999999999999999999Y",
        ] {
            assert_eq!(parse_ms(bad), None, "{bad:?}");
        }
    }
}
