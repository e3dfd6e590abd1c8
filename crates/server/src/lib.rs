//! berth server layer.
