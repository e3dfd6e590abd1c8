//! berth store layer.
