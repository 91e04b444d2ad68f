//! Why an API operation was refused ([`ApiError`]), independent of the transport: REST and gRPC
//! each map it to their status codes.

/// Why an operation was refused; each transport maps it to its status codes.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    BadRequest {
        field: String,
        message: String,
    },
    Forbidden {
        field: Option<String>,
        message: String,
    },
    /// Absent — or invisible to the caller (no existence leak across tenants).
    NotFound {
        field: String,
        message: String,
    },
    /// Not accepted now (e.g. the queue could not be mirrored to a majority); retry.
    Unavailable {
        message: String,
    },
    /// Writes go to the leader.
    NotLeader {
        leader_id: Option<u64>,
        leader: Option<String>,
        /// The leader's REST URL, when the quorum holds it: clients go there.
        leader_url: Option<String>,
    },
    /// The request conflicts with the current state (a tenant that exists, or is still in use).
    Conflict {
        message: String,
    },
}

impl ApiError {
    pub fn message(&self) -> String {
        match self {
            ApiError::BadRequest { message, .. }
            | ApiError::Forbidden { message, .. }
            | ApiError::NotFound { message, .. } => message.clone(),
            ApiError::NotLeader { .. } => "not the quorum leader".into(),
            ApiError::Unavailable { message } | ApiError::Conflict { message } => message.clone(),
        }
    }

    pub fn field(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { field, .. } | ApiError::NotFound { field, .. } => Some(field),
            ApiError::Forbidden { field, .. } => field.as_deref(),
            ApiError::NotLeader { .. } | ApiError::Unavailable { .. } | ApiError::Conflict { .. } => None,
        }
    }
}

pub fn forbidden(message: &str) -> ApiError {
    ApiError::Forbidden {
        field: None,
        message: format!("forbidden: {message}"),
    }
}
