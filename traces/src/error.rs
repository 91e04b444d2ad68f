//! Typed errors. Every message names the file, and where it applies the line and the field.

use std::fmt;

/// One problem found in an input file: where, which field, what.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub file: String,
    /// 1-based line number; 0 when the problem is not tied to a line.
    pub line: u64,
    pub field: Option<String>,
    /// A stable machine-readable reason (`malformed_line`, `runtime_negative`, ...).
    pub reason: String,
    pub message: String,
}

impl Problem {
    /// A problem at `line` of `file`, in `field`.
    pub fn at(file: &str, line: u64, field: &str, reason: &str, message: String) -> Problem {
        Problem {
            file: file.into(),
            line,
            field: Some(field.into()),
            reason: reason.into(),
            message,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(Problem),
    #[error("{file}: {message}")]
    Config { file: String, message: String },
}

impl TraceError {
    pub fn io(path: &std::path::Path, source: std::io::Error) -> TraceError {
        TraceError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
