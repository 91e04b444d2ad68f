//! An S3-compatible object store, as the quorum's cold archive uses it (book: "Sensitive audit
//! logs | Cold tier (S3) | 7 years"): objects written once and never replaced, read back whole.
//! Requests are signed with AWS SigV4 (presigned by `rusty-s3`, no SDK) and sent with reqwest; the
//! credentials come from the environment, never from a file.
//!
//! Write-once is enforced here, on any S3 implementation: [`ObjectStore::put_once`] looks first and
//! writes only a key that is absent; a key already holding the same bytes (a writer that stopped
//! between writing and recording it) is success, a key holding other bytes is
//! [`S3Error::Conflict`] — nothing is overwritten.

use crate::snapshots::sha256_hex;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use std::time::Duration;

/// How long a signed request stays valid (it is sent at once).
const SIGNED_FOR: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum S3Error {
    #[error("the archive endpoint `{0}` is not a URL with a host")]
    Endpoint(String),
    #[error("{method} {url}: {message}")]
    Transport {
        method: String,
        url: String,
        message: String,
    },
    #[error("{method} {key}: HTTP {status}: {body}")]
    Status {
        method: String,
        key: String,
        status: u16,
        body: String,
    },
    #[error("{key} already holds other bytes (sha256 {found}, not {wanted}): archive objects are never replaced")]
    Conflict { key: String, found: String, wanted: String },
    #[error("listing {prefix}: {message}")]
    List { prefix: String, message: String },
}

/// One bucket of an S3-compatible store.
#[derive(Clone)]
pub struct ObjectStore {
    bucket: Bucket,
    creds: Credentials,
    http: reqwest::Client,
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectStore({})", self.bucket.base_url())
    }
}

impl ObjectStore {
    /// `endpoint` (e.g. `https://s3.example.org`), path-style addressing (what on-site stores
    /// serve), the bucket, its region, and the access key pair.
    pub fn new(
        endpoint: &str,
        bucket: &str,
        region: &str,
        access_key: &str,
        secret_key: &str,
        timeout: Duration,
    ) -> Result<ObjectStore, S3Error> {
        let url: reqwest::Url = endpoint.parse().map_err(|_| S3Error::Endpoint(endpoint.into()))?;
        let bucket = Bucket::new(url, UrlStyle::Path, bucket.to_string(), region.to_string())
            .map_err(|_| S3Error::Endpoint(endpoint.into()))?;
        let http = crate::http::tls_client(timeout).map_err(|e| S3Error::Transport {
            method: "client".into(),
            url: endpoint.into(),
            message: e.to_string(),
        })?;
        Ok(ObjectStore {
            bucket,
            creds: Credentials::new(access_key, secret_key),
            http,
        })
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        self.bucket.name()
    }

    async fn send(&self, method: &str, key: &str, req: reqwest::RequestBuilder) -> Result<reqwest::Response, S3Error> {
        req.send().await.map_err(|e| S3Error::Transport {
            method: method.into(),
            url: format!("{}{key}", self.bucket.base_url()),
            message: e.to_string(),
        })
    }

    async fn status(method: &str, key: &str, r: reqwest::Response) -> S3Error {
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        S3Error::Status {
            method: method.into(),
            key: key.into(),
            status,
            body: body.chars().take(300).collect(),
        }
    }

    /// Creates the bucket when it does not exist yet (a site usually makes it, with object lock).
    pub async fn ensure_bucket(&self) -> Result<(), S3Error> {
        let url = self.bucket.head_bucket(Some(&self.creds)).sign(SIGNED_FOR);
        let r = self.send("HEAD", "", self.http.head(url)).await?;
        if r.status().is_success() {
            return Ok(());
        }
        let url = self.bucket.create_bucket(&self.creds).sign(SIGNED_FOR);
        let r = self
            .send(
                "PUT",
                "",
                self.http.put(url).header(reqwest::header::CONTENT_LENGTH, "0"),
            )
            .await?;
        // Another member made it meanwhile: as good.
        if r.status().is_success() || r.status().as_u16() == 409 {
            return Ok(());
        }
        Err(Self::status("PUT bucket", self.bucket.name(), r).await)
    }

    /// The object's bytes; `None` when there is no such key.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, S3Error> {
        let url = self.bucket.get_object(Some(&self.creds), key).sign(SIGNED_FOR);
        let r = self.send("GET", key, self.http.get(url)).await?;
        if r.status().as_u16() == 404 {
            return Ok(None);
        }
        if !r.status().is_success() {
            return Err(Self::status("GET", key, r).await);
        }
        let bytes = r.bytes().await.map_err(|e| S3Error::Transport {
            method: "GET".into(),
            url: key.into(),
            message: e.to_string(),
        })?;
        Ok(Some(bytes.to_vec()))
    }

    /// Writes `bytes` at `key` unless the key exists: the same bytes there already are success,
    /// other bytes are [`S3Error::Conflict`] (never overwritten). Returns the bytes' SHA-256.
    pub async fn put_once(&self, key: &str, bytes: Vec<u8>) -> Result<String, S3Error> {
        let wanted = sha256_hex(&bytes);
        if let Some(there) = self.get(key).await? {
            let found = sha256_hex(&there);
            return if found == wanted {
                Ok(wanted)
            } else {
                Err(S3Error::Conflict {
                    key: key.into(),
                    found,
                    wanted,
                })
            };
        }
        let url = self.bucket.put_object(Some(&self.creds), key).sign(SIGNED_FOR);
        let r = self.send("PUT", key, self.http.put(url).body(bytes)).await?;
        if !r.status().is_success() {
            return Err(Self::status("PUT", key, r).await);
        }
        Ok(wanted)
    }

    /// Every key under `prefix`, in the store's (lexicographic) order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, S3Error> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut action = self.bucket.list_objects_v2(Some(&self.creds));
            action.with_prefix(prefix);
            if let Some(t) = &token {
                action.with_continuation_token(t.clone());
            }
            let url = action.sign(SIGNED_FOR);
            let r = self.send("GET", prefix, self.http.get(url)).await?;
            if !r.status().is_success() {
                return Err(Self::status("LIST", prefix, r).await);
            }
            let text = r.text().await.map_err(|e| S3Error::List {
                prefix: prefix.into(),
                message: e.to_string(),
            })?;
            let page = rusty_s3::actions::ListObjectsV2::parse_response(&text).map_err(|e| S3Error::List {
                prefix: prefix.into(),
                message: e.to_string(),
            })?;
            keys.extend(page.contents.into_iter().map(|c| c.key));
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => return Ok(keys),
            }
        }
    }
}
