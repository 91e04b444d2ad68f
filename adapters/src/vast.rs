//! The VAST REST client: the operations the book's "VAST API Integration Points" table lists —
//! exports with a QoS policy, bandwidth floors, data locality (the data-readiness score), snapshots,
//! prefetch from the warm tier, and the audit-log query — over [`crate::http`] (timeouts, retries
//! with backoff, typed errors).

use crate::http::{Http, HttpConfig, HttpError};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A QoS policy on an export (bandwidth floor in GB/s; optional IOPS cap).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Qos {
    pub bandwidth_floor_gbps: f64,
    #[serde(default)]
    pub iops_limit: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Export {
    pub id: String,
    pub path: String,
    pub tenant: String,
    pub qos: Qos,
}

/// Where a path's data is (for the scheduler's data-readiness score).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Locality {
    pub path: String,
    /// `hot`, `warm` or `cold`.
    pub tier: String,
    pub bytes: u64,
    /// Fraction of the bytes already on the hot tier, 0..1.
    pub hot_fraction: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    pub id: String,
    pub path: String,
    pub name: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Prefetch {
    pub id: String,
    pub path: String,
    pub state: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AuditRecord {
    pub at: String,
    pub user: String,
    pub path: String,
    pub op: String,
}

pub struct VastClient {
    http: Http,
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, v: serde_json::Value) -> Result<T, HttpError> {
    serde_json::from_value(v).map_err(|e| HttpError::Decode {
        method: String::new(),
        url: what.to_string(),
        message: e.to_string(),
    })
}

impl VastClient {
    pub fn new(cfg: HttpConfig) -> Result<VastClient, HttpError> {
        Ok(VastClient { http: Http::new(cfg)? })
    }

    /// `POST /exports` with a QoS policy (job start).
    pub async fn create_export(&self, path: &str, tenant: &str, qos: &Qos) -> Result<Export, HttpError> {
        let v = self
            .http
            .call(
                Method::POST,
                "/exports",
                Some(&json!({"path": path, "tenant": tenant, "qos": qos})),
            )
            .await?;
        decode("/exports", v)
    }

    /// `PATCH /exports/{id}/qos`: the bandwidth floor (job start).
    pub async fn set_bandwidth_floor(&self, export: &str, gbps: f64) -> Result<Export, HttpError> {
        let p = format!("/exports/{export}/qos");
        let v = self
            .http
            .call(Method::PATCH, &p, Some(&json!({"bandwidth_floor_gbps": gbps})))
            .await?;
        decode(&p, v)
    }

    /// `DELETE /exports/{id}`: releases the export and its QoS policy (epilogue).
    pub async fn delete_export(&self, export: &str) -> Result<(), HttpError> {
        self.http
            .call(Method::DELETE, &format!("/exports/{export}"), None)
            .await
            .map(|_| ())
    }

    /// `GET /catalog?path=…`: data locality (scheduling).
    pub async fn locality(&self, path: &str) -> Result<Locality, HttpError> {
        let p = format!("/catalog?path={}", lattice_util::url::path(path));
        let v = self.http.call(Method::GET, &p, None).await?;
        decode(&p, v)
    }

    /// `POST /snapshots` (job start or checkpoint).
    pub async fn create_snapshot(&self, path: &str, name: &str) -> Result<Snapshot, HttpError> {
        let v = self
            .http
            .call(Method::POST, "/snapshots", Some(&json!({"path": path, "name": name})))
            .await?;
        decode("/snapshots", v)
    }

    /// `POST /dataspace/prefetch`: warm → hot while the job waits.
    pub async fn prefetch(&self, path: &str) -> Result<Prefetch, HttpError> {
        let v = self
            .http
            .call(Method::POST, "/dataspace/prefetch", Some(&json!({"path": path})))
            .await?;
        decode("/dataspace/prefetch", v)
    }

    /// `GET /audit/logs?path=…` (compliance reporting).
    pub async fn audit(&self, path: &str) -> Result<Vec<AuditRecord>, HttpError> {
        let p = format!("/audit/logs?path={}", lattice_util::url::path(path));
        let v = self.http.call(Method::GET, &p, None).await?;
        decode(&p, v["records"].clone())
    }
}
