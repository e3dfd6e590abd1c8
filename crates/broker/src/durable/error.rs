//! The one error a journal reports: what the broker was doing, and the
//! store's error as its cause (kept, so logs and clients see both).

use std::sync::Arc;

/// A journal failure (I/O error, failed fsync, poisoned group): what the
/// broker was doing, and the store's error as its cause.
#[derive(Debug, Clone)]
pub struct JournalError {
    what: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl JournalError {
    /// A failure with no underlying error (e.g. "not stored").
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            source: None,
        }
    }

    /// A failure caused by `source` (the store's error), kept as the cause.
    pub fn caused_by(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            what: what.into(),
            source: Some(Arc::new(source)),
        }
    }
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            // Operators read this in one log line: say the cause too.
            Some(s) => write!(f, "{}: {s}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}
