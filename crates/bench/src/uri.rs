//! AMQP URIs as the bench shows them.

/// The URI with its password hidden, for messages and result files.
#[must_use]
pub fn redact(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => uri.to_string(),
    }
}
