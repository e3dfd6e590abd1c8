//! The seed experiments as a load generator, with ministat-style statistics.
pub mod stats;
