//! What can go wrong reaching storage; every message names the URL and
//! says, in the user's terms first, what to check.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} '{url}': {}", storage_reason(source))]
    Storage {
        what: &'static str,
        url: String,
        source: Box<object_store::Error>,
    },
    #[error("'{url}' does not exist")]
    NotFound { url: String },
    #[error(
        "'{url}' is not a storage URL meshrun can use: {reason}; accepted: {}",
        crate::SCHEMES
    )]
    BadUrl { url: String, reason: String },
}

/// What went wrong with a storage request, in the user's terms first.
fn storage_reason(e: &object_store::Error) -> String {
    use object_store::Error as E;
    const DENIED: &str =
        "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)";
    const MISSING: &str = "not found (does the bucket exist?)";
    const CODES_DENIED: [&str; 4] = [
        "403 Forbidden",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AccessDenied",
    ];
    // Some requests (a listing) fail with a generic error that holds the
    // store's answer: its code says what happened.
    let text = e.to_string();
    let hint = match e {
        E::NotFound { .. } => MISSING,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => DENIED,
        _ if CODES_DENIED.iter().any(|code| text.contains(code)) => DENIED,
        _ if text.contains("NoSuchBucket") => MISSING,
        _ => {
            "the storage did not answer as expected (is AWS_ENDPOINT_URL right, and the server up?)"
        }
    };
    format!("{hint}; {text}")
}
