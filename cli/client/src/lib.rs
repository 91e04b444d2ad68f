//! `lattice-client` — the Rust client of `lattice-runtime`'s API, used by the `lattice` command and
//! by Rust programs. [`Client`] sends REST requests to the quorum's members in turn (past one that is
//! down or not the leader, to the leader a member names), waits out rate limits, renews its token
//! when a stream ends for its expiry, and reads Server-Sent Event streams; [`api`] adds typed calls
//! on the API's own request and view types, and every other operation is a [`Client::call`] away.
//! Refusals are [`Error::Api`] with the status and the field the API names.
//!
//! ```no_run
//! use lattice_client::Client;
//! use std::time::Duration;
//!
//! let client = Client::connect("http://127.0.0.1:8080", std::env::var("LATTICE_TOKEN").ok());
//! let request = serde_json::from_value(serde_json::json!({
//!     "tenant": "physics", "entrypoint": "hostname",
//!     "resources": {"nodes": 2}, "lifecycle": {"type": "bounded", "walltime": "10m"}
//! }))?;
//! let id = client.submit(&request)?.id;
//! let end = client.follow_logs(&id, "stdout", |node, text| print!("[{node}] {text}"))?;
//! println!("{id}: {end}");
//! # let _ = client.wait(&id, Duration::from_secs(1), Duration::from_secs(60));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod api;
pub mod error;
pub mod transport;

pub use api::{ListFilter, Submitted};
pub use error::{Error, Result};
pub use transport::{Client, Renew, endpoints};

/// The API's request and view types (declared once, with the control plane).
pub use lattice_control::tasks::{LaunchView, TaskRequest};
pub use lattice_control::{AllocationView, NodeView, SubmitRequest};
