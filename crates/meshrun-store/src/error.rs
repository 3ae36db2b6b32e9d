//! What can go wrong reaching storage; every message names the URL and
//! says what the storage itself answered first, then, where it fits, what
//! to check.

use std::error::Error as _;

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
    #[error("{name}='{value}' is not accepted: use {accepted}")]
    BadSetting {
        name: &'static str,
        value: String,
        accepted: &'static str,
    },
}

/// Why the S3 client refused a request before sending it: without
/// credentials it would ask the instance metadata service for some (see
/// `credentials::require_source`).
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "no AWS credentials{} in this shell ({}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY{} \
     or name a profile that has them with AWS_PROFILE; on a cloud host whose instance role \
     should be used, set {}=1 to ask its instance metadata service. Nothing was sent",
    if endpoint.is_some() { "" } else { " or endpoint" },
    missing(endpoint.as_deref(), profile),
    if endpoint.is_some() { "" } else { " (and AWS_ENDPOINT_URL for a store other than AWS)" },
    crate::credentials::INSTANCE_METADATA_VAR
)]
pub struct NoCredentials {
    /// The endpoint the shell names, if any.
    pub endpoint: Option<String>,
    /// What the profile files held (see `credentials::profile_seen`).
    pub profile: String,
}

/// What a shell without credentials lacks, as the user would look for it.
fn missing(endpoint: Option<&str>, profile: &str) -> String {
    let keys = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are unset";
    match endpoint {
        Some(endpoint) => format!("{keys}, and {profile}; the endpoint is '{endpoint}'"),
        None => format!("AWS_ENDPOINT_URL, {keys}, and {profile}"),
    }
}

const DENIED: &str =
    "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)";
const NO_ANSWER: &str = "is AWS_ENDPOINT_URL right, and the server up?";
/// S3's codes for a request whose credentials the store refused.
const CODES_DENIED: [&str; 5] = [
    "AccessDenied",
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "InvalidToken",
    "ExpiredToken",
];

/// What went wrong with a storage request: what the server answered (its
/// status, and the code and message of an S3 error document), then a hint
/// where one fits, then the request that failed.
fn storage_reason(e: &object_store::Error) -> String {
    use object_store::Error as E;
    // Nothing was sent: what is missing is the whole story.
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(missing) = s.downcast_ref::<NoCredentials>() {
            return missing.to_string();
        }
        source = s.source();
    }
    let text = e.to_string();
    let answer = Answer::find(&text);
    let hint = match e {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Some(DENIED.to_string()),
        _ if answer.denied() => Some(DENIED.to_string()),
        // The server's own code says it already.
        _ if answer.code.is_some() => None,
        E::NotFound { .. } => Some("not found (does the bucket exist?)".to_string()),
        _ if answer.status.is_some() => None,
        _ => Some(unanswered(e).map_or_else(
            || "the storage's answer was not understood".to_string(),
            |cause| format!("the storage did not answer: {cause} ({NO_ANSWER})"),
        )),
    };
    // The error document is said above; the rest names the request.
    let detail = ["<?xml", "<Error>"]
        .iter()
        .filter_map(|start| text.find(start))
        .min()
        .map_or(text.as_str(), |at| text[..at].trim_end_matches([' ', ':']));
    [answer.said(), hint, Some(detail.to_string())]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// When no answer came at all (the connection was refused, the name did
/// not resolve, the request timed out or was cut off), the innermost cause
/// (`Connection refused (os error 111)`): the error's own text stops at
/// "error sending request".
fn unanswered(e: &object_store::Error) -> Option<String> {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut source: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(s) = source {
        let transport = if let Some(http) = s.downcast_ref::<HttpError>() {
            !matches!(http.kind(), HttpErrorKind::Decode)
        } else if let Some(r) = s.downcast_ref::<reqwest::Error>() {
            // Meshrun's own requests (listing unfinished uploads).
            r.is_connect() || r.is_timeout() || r.is_request()
        } else {
            source = s.source();
            continue;
        };
        if !transport {
            return None;
        }
        let mut cause = s;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        return Some(cause.to_string());
    }
    None
}

/// What the server answered, as the error's text holds it: the status
/// line, and an S3 error document's code and message.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    /// `500 Internal Server Error`.
    status: Option<String>,
    code: Option<String>,
    message: Option<String>,
}

impl Answer {
    fn find(text: &str) -> Self {
        // `object_store` (and uploads.rs) write "...status code: 500
        // Internal Server Error: <body>".
        let status = text.split_once("status code: ").map(|(_, rest)| {
            rest.split_once(':')
                .map_or(rest, |(status, _)| status)
                .trim()
                .to_string()
        });
        let element = |name: &str| {
            let (_, rest) = text.split_once(&format!("<{name}>"))?;
            let (value, _) = rest.split_once(&format!("</{name}>"))?;
            let value = quick_xml::escape::unescape(value)
                .map_or_else(|_| value.trim().to_string(), |v| v.trim().to_string());
            (!value.is_empty()).then_some(value)
        };
        Self {
            status: status.filter(|s| !s.is_empty()),
            code: element("Code"),
            message: element("Message"),
        }
    }

    fn denied(&self) -> bool {
        self.status
            .as_deref()
            .is_some_and(|s| s.starts_with("401") || s.starts_with("403"))
            || self
                .code
                .as_deref()
                .is_some_and(|c| CODES_DENIED.contains(&c))
    }

    /// `the server answered 500 Internal Server Error: InternalError: no
    /// free volumes`, or `None` when it answered nothing.
    fn said(&self) -> Option<String> {
        let parts: Vec<&str> = [&self.status, &self.code, &self.message]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        (!parts.is_empty()).then(|| format!("the server answered {}", parts.join(": ")))
    }
}

#[cfg(test)]
mod tests {
    use super::Answer;

    #[test]
    fn an_s3_error_document_is_read_from_the_error_text() {
        let text = "Generic S3 error: Error performing PUT http://127.0.0.1:1/b/k in 3s - Server \
                    returned non-2xx status code: 500 Internal Server Error: <?xml version=\"1.0\" \
                    encoding=\"UTF-8\"?><Error><Code>InternalError</Code><Message>no free \
                    volumes &amp; more</Message><Resource>/b/k</Resource></Error>";
        let answer = Answer::find(text);
        assert_eq!(
            answer,
            Answer {
                status: Some("500 Internal Server Error".into()),
                code: Some("InternalError".into()),
                message: Some("no free volumes & more".into()),
            }
        );
        assert_eq!(
            answer.said().as_deref(),
            Some("the server answered 500 Internal Server Error: InternalError: no free volumes & more")
        );
        assert!(!answer.denied());
    }

    #[test]
    fn a_bodiless_403_is_denied_and_no_answer_says_nothing() {
        let answer = Answer::find("Server returned non-2xx status code: 403 Forbidden: ");
        assert_eq!(answer.status.as_deref(), Some("403 Forbidden"));
        assert!(answer.denied());
        assert_eq!(Answer::find("Connection refused").said(), None);
    }
}
