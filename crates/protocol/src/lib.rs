//! berth protocol layer.
