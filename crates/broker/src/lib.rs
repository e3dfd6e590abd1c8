//! berth broker layer.
