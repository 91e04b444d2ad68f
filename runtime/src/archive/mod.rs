//! The audit log's cold tier (book: "Sensitive audit logs | Cold tier (S3) | 7 years", "Queries
//! spanning more than 90 days may be served from cold tier"): `services.archive`, an S3-compatible
//! bucket. The leader moves audit entries older than the hot window out of the replicated state —
//! each run of them one write-once object, recorded at the quorum before the entries leave it
//! ([`lattice_adapters::audit_archive`]) — and every member reads the objects back for a query whose
//! time range reaches before the held log, each checked against the quorum's record (checksum,
//! hashes, signatures, chain). Backups made with `lattice admin backup` and sensitive sessions'
//! recordings are archived there too.
//!
//! The credentials come from the environment (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
//! unless the config names other variables), never from the file.

pub mod service;

use lattice_adapters::AuditEntry;
use lattice_adapters::audit_archive::{self, ArchivedSegment};
use lattice_adapters::quorum_state::{QuorumCommand, QuorumResponse};
use lattice_adapters::s3::ObjectStore;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// `services.archive` in the runtime config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveConfig {
    /// The S3 endpoint, e.g. `https://s3.example.org` (path-style requests).
    pub endpoint: String,
    pub bucket: String,
    #[serde(default = "region_default")]
    pub region: String,
    /// Every object's key starts with it: `PREFIX/audit/…`, `PREFIX/backups/…`.
    #[serde(default = "prefix_default")]
    pub prefix: String,
    /// Audit entries younger than this stay in the quorum's state; older ones are archived.
    #[serde(default = "hot_window_default")]
    pub hot_window: String,
    /// How often the leader looks for entries to archive.
    #[serde(default = "every_default")]
    pub every: String,
    /// Entries per archive object, at most.
    #[serde(default = "max_entries_default")]
    pub max_entries: usize,
    /// The environment variables holding the access key pair.
    #[serde(default = "access_key_env_default")]
    pub access_key_env: String,
    #[serde(default = "secret_key_env_default")]
    pub secret_key_env: String,
    #[serde(default = "timeout_default")]
    pub timeout: String,
}

fn region_default() -> String {
    "us-east-1".into()
}
fn prefix_default() -> String {
    "lattice".into()
}
fn hot_window_default() -> String {
    "90d".into()
}
fn every_default() -> String {
    "1h".into()
}
fn max_entries_default() -> usize {
    100_000
}
fn access_key_env_default() -> String {
    "AWS_ACCESS_KEY_ID".into()
}
fn secret_key_env_default() -> String {
    "AWS_SECRET_ACCESS_KEY".into()
}
fn timeout_default() -> String {
    "30s".into()
}

fn duration(text: &str, what: &str) -> anyhow::Result<Duration> {
    let d = lattice_traces::parse_duration(text).map_err(|m| anyhow::anyhow!("services.archive.{what}: {m}"))?;
    Ok(Duration::from_millis(d.0.max(1)))
}

/// Archived segments kept in memory (each at most `max_entries` entries) for repeated queries.
const CACHED_SEGMENTS: usize = 16;

/// The archive as a member uses it.
pub struct Archive {
    store: ObjectStore,
    prefix: String,
    hot_window: Duration,
    pub(crate) every: Duration,
    pub(crate) max_entries: usize,
    bucket_ready: tokio::sync::OnceCell<()>,
    /// Segments read back and verified, by key (objects never change: a cached one stays right).
    cache: std::sync::Mutex<BTreeMap<String, Arc<Vec<AuditEntry>>>>,
}

/// What reading the archive for a query found.
#[derive(Default)]
pub struct ArchiveRead {
    pub entries: Vec<AuditEntry>,
    /// Objects missing, unreadable or failing their checks (each names the object).
    pub problems: Vec<String>,
}

impl Archive {
    pub fn from_config(c: &ArchiveConfig) -> anyhow::Result<Archive> {
        let env = |name: &str| {
            std::env::var(name).map_err(|_| {
                anyhow::anyhow!(
                    "services.archive: the environment variable {name} (the archive's credentials) is not set"
                )
            })
        };
        let store = ObjectStore::new(
            &c.endpoint,
            &c.bucket,
            &c.region,
            &env(&c.access_key_env)?,
            &env(&c.secret_key_env)?,
            duration(&c.timeout, "timeout")?,
        )
        .map_err(|e| anyhow::anyhow!("services.archive: {e}"))?;
        if c.max_entries == 0 {
            anyhow::bail!("services.archive.max_entries: must be at least 1");
        }
        Ok(Archive {
            store,
            prefix: c.prefix.trim_matches('/').to_string(),
            hot_window: duration(&c.hot_window, "hot_window")?,
            every: duration(&c.every, "every")?,
            max_entries: c.max_entries,
            bucket_ready: tokio::sync::OnceCell::new(),
            cache: Default::default(),
        })
    }

    async fn ready(&self) -> Result<(), lattice_adapters::s3::S3Error> {
        self.bucket_ready
            .get_or_try_init(|| async { self.store.ensure_bucket().await })
            .await
            .map(|_| ())
    }

    /// The key of the object holding entries `first..=last`.
    fn segment_key(&self, first: u64, last: u64) -> String {
        format!("{}/audit/{first:020}-{last:020}.jsonl", self.prefix)
    }

    /// Moves the oldest held entries past the hot window (at `now_ms`) to one new object, then has
    /// the quorum record it (and drop them): how many moved. Called by the leader.
    pub async fn archive_once(&self, member: &lattice_adapters::Member, now_ms: u64) -> Result<usize, String> {
        let before = now_ms.saturating_sub(self.hot_window.as_millis() as u64);
        let cut = member.read(|q| q.archive_cut(before, self.max_entries).to_vec()).await;
        let (Some(first), Some(last)) = (cut.first(), cut.last()) else {
            return Ok(0);
        };
        self.ready().await.map_err(|e| e.to_string())?;
        let key = self.segment_key(first.seq, last.seq);
        let bytes = audit_archive::encode(&cut);
        let segment = ArchivedSegment::of(&key, &cut, &bytes).expect("a non-empty cut");
        self.store.put_once(&key, bytes).await.map_err(|e| e.to_string())?;
        match member.propose(QuorumCommand::AuditArchived { segment }).await {
            Ok(QuorumResponse::Applied) => {
                self.remember(&key, Arc::new(cut.clone()));
                Ok(cut.len())
            }
            Ok(other) => Err(format!("{key}: the quorum did not record it: {other:?}")),
            Err(e) => Err(format!("{key}: {e}")),
        }
    }

    fn remember(&self, key: &str, entries: Arc<Vec<AuditEntry>>) {
        let mut cache = self.cache.lock().expect("archive cache");
        cache.insert(key.to_string(), entries);
        while cache.len() > CACHED_SEGMENTS {
            let oldest = cache.keys().next().cloned().expect("non-empty");
            cache.remove(&oldest);
        }
    }

    /// The archived entries of the segments `manifest` records that may fall in `[since, until)`,
    /// each object read back (or from the cache) and checked against its record.
    pub async fn read(&self, manifest: &[ArchivedSegment], since: Option<u64>, until: Option<u64>) -> ArchiveRead {
        let mut out = ArchiveRead::default();
        for seg in manifest.iter().filter(|m| m.overlaps(since, until)) {
            let cached = self.cache.lock().expect("archive cache").get(&seg.key).cloned();
            let entries = match cached {
                Some(e) => e,
                None => match self.store.get(&seg.key).await {
                    Ok(Some(bytes)) => match audit_archive::decode(seg, &bytes) {
                        Ok(e) => {
                            let e = Arc::new(e);
                            self.remember(&seg.key, e.clone());
                            e
                        }
                        Err(m) => {
                            out.problems.push(m);
                            continue;
                        }
                    },
                    Ok(None) => {
                        out.problems
                            .push(format!("{}: missing from bucket {}", seg.key, self.store.bucket()));
                        continue;
                    }
                    Err(e) => {
                        out.problems.push(e.to_string());
                        continue;
                    }
                },
            };
            out.entries.extend(entries.iter().cloned());
        }
        out
    }

    /// Archives a sensitive session's recording (book: `sensitive-audit/{tenant}/{alloc_id}/sessions/`):
    /// `PREFIX/recordings/TENANT/ALLOC/sessions/NAME`, never replaced; its key.
    pub async fn archive_recording(&self, path: &std::path::Path, tenant: &str, alloc: &str) -> Result<String, String> {
        self.archive_file(path, |name| format!("recordings/{tenant}/{alloc}/sessions/{name}"))
            .await
    }

    /// Archives a backup file written by this member (`PREFIX/backups/NAME`, never replaced): its key.
    pub async fn archive_backup(&self, path: &std::path::Path) -> Result<String, String> {
        self.archive_file(path, |name| format!("backups/{name}")).await
    }

    /// Writes the file at `path` under `PREFIX/` + `key(its file name)`, never replacing: its key.
    async fn archive_file(&self, path: &std::path::Path, key: impl FnOnce(&str) -> String) -> Result<String, String> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: not a file name", path.display()))?;
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.ready().await.map_err(|e| e.to_string())?;
        let key = format!("{}/{}", self.prefix, key(name));
        self.store.put_once(&key, bytes).await.map_err(|e| e.to_string())?;
        Ok(key)
    }
}
