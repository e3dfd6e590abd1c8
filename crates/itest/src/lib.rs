//! Helpers for black-box tests of the berth binary.
