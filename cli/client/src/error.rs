//! Why a call did not succeed ([`Error`]).

use serde_json::Value;

/// Why a call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with a refusal: its status, message and the field it names.
    #[error("{message} ({}HTTP {status})", field.as_deref().map(|f| format!("field `{f}`, ")).unwrap_or_default())]
    Api {
        status: u16,
        message: String,
        field: Option<String>,
        /// The whole answer (`{"error", "field", ...}`).
        body: Value,
    },
    /// 401 to a request sent without a token.
    #[error("Not logged in. Run `lattice login` first.")]
    NotLoggedIn,
    /// A federation call to a runtime built without the `federation` feature.
    #[error("this site has no federation: its lattice-runtime is built without the `federation` feature (HTTP 404)")]
    NoFederation,
    /// No endpoint answered: the last one's failure, and what the others said before.
    #[error("cannot reach the Lattice API at {endpoint}{tried}")]
    Unreachable {
        endpoint: String,
        /// ` (after A: why; B: why)` when other endpoints were tried first, else empty.
        tried: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stream broke off while being read.
    #[error("reading the stream {url}")]
    Stream {
        url: String,
        #[source]
        source: std::io::Error,
    },
    /// The answer was not what the call expects (a view that does not decode).
    #[error("unexpected answer to {what}: {why}")]
    Unexpected { what: String, why: String },
    /// The request cannot be made (e.g. a method the client does not send).
    #[error("{0}")]
    Request(String),
}

impl Error {
    /// The HTTP status of an API refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            Error::NotLoggedIn => Some(401),
            Error::NoFederation => Some(404),
            _ => None,
        }
    }

    /// An API refusal from an answer's status and JSON body.
    pub(crate) fn api(status: u16, body: Value) -> Error {
        Error::Api {
            status,
            message: body["error"].as_str().unwrap_or("request failed").to_string(),
            field: body["field"].as_str().map(str::to_string),
            body,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refusals_read_as_the_cli_prints_them() {
        let e = Error::api(400, json!({"error": "must be positive", "field": "walltime"}));
        assert_eq!(e.to_string(), "must be positive (field `walltime`, HTTP 400)");
        assert_eq!(e.status(), Some(400));
        let e = Error::api(403, json!({"error": "forbidden: another tenant"}));
        assert_eq!(e.to_string(), "forbidden: another tenant (HTTP 403)");
        assert_eq!(Error::api(500, json!("boom")).to_string(), "request failed (HTTP 500)");
    }
}
