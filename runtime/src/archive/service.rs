//! The archiver's task in a running member (the leader's part of [`super`]).

use super::Archive;
use crate::context::Shared;
use std::sync::Arc;

/// The archiver's task: every `every` the leader archives what left the hot window (several
/// objects in a row when there is a backlog).
pub async fn run(s: Arc<Shared>, a: Arc<Archive>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    while crate::context::sleep_unless_stopped(&mut stopped, a.every).await {
        if s.leading.lock().await.is_none() {
            continue;
        }
        loop {
            match a.archive_once(&s.member, s.clock.now_ms()).await {
                Ok(n) if n >= a.max_entries => continue,
                Ok(0) => {}
                Ok(n) => tracing::info!("archived {n} audit entries"),
                // Nothing left the state: the entries stay held and the next round tries again.
                Err(e) => tracing::warn!("audit archive: {e}"),
            }
            break;
        }
    }
}
