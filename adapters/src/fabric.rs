//! The Slingshot fabric-manager client (CXI services: create at launch start, auth key, revoke at
//! launch end) over [`crate::http`], and the VNI pool network domains draw from (book: "Network
//! Domains": sequential allocation from `vni_pool_start..=vni_pool_end`, freed VNIs return to the
//! pool, exhaustion is an error that says so).

use crate::http::{Http, HttpConfig, HttpError};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeSet;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CxiService {
    pub id: String,
    pub vni: u32,
    pub nodes: Vec<String>,
}

pub struct FabricClient {
    http: Http,
}

impl FabricClient {
    pub fn new(cfg: HttpConfig) -> Result<FabricClient, HttpError> {
        Ok(FabricClient { http: Http::new(cfg)? })
    }

    /// `POST /fabric/cxi/services` for an allocation's nodes on a VNI (launch start).
    pub async fn create_service(&self, alloc: &str, vni: u32, nodes: &[String]) -> Result<CxiService, HttpError> {
        let v = self
            .http
            .call(
                Method::POST,
                "/fabric/cxi/services",
                Some(&json!({"name": alloc, "vni": vni, "nodes": nodes})),
            )
            .await?;
        serde_json::from_value(v).map_err(|e| HttpError::Decode {
            method: "POST".into(),
            url: "/fabric/cxi/services".into(),
            message: e.to_string(),
        })
    }

    /// `GET /fabric/cxi/services/{id}/auth`: the key the tasks get as `FI_CXI_AUTH_KEY`.
    pub async fn auth_key(&self, service: &str) -> Result<String, HttpError> {
        let p = format!("/fabric/cxi/services/{service}/auth");
        let v = self.http.call(Method::GET, &p, None).await?;
        v["auth_key"].as_str().map(str::to_string).ok_or(HttpError::Decode {
            method: "GET".into(),
            url: p,
            message: "no `auth_key` in the answer".into(),
        })
    }

    /// `DELETE /fabric/cxi/services/{id}` (launch end). Revoking one that is gone is not an error.
    pub async fn revoke(&self, service: &str) -> Result<(), HttpError> {
        match self
            .http
            .call(Method::DELETE, &format!("/fabric/cxi/services/{service}"), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// VNIs for network domains.
#[derive(Clone, Debug)]
pub struct VniPool {
    start: u32,
    end: u32,
    next: u32,
    used: BTreeSet<u32>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VniError {
    #[error("cannot create network domain — VNI pool exhausted ({used}/{total} in use)")]
    Exhausted { used: usize, total: usize },
    #[error("VNI pool {start}-{end}: VNIs below 1000 are reserved (1 management, 2 telemetry)")]
    Reserved { start: u32, end: u32 },
}

impl VniPool {
    /// The book's default is 1000..=4095.
    pub fn new(start: u32, end: u32) -> Result<VniPool, VniError> {
        if start < 1000 || end < start {
            return Err(VniError::Reserved { start, end });
        }
        Ok(VniPool {
            start,
            end,
            next: start,
            used: BTreeSet::new(),
        })
    }

    pub fn total(&self) -> usize {
        (self.end - self.start + 1) as usize
    }

    pub fn in_use(&self) -> usize {
        self.used.len()
    }

    /// The next free VNI after the last one handed out (sequential, wrapping).
    pub fn allocate(&mut self) -> Result<u32, VniError> {
        if self.used.len() == self.total() {
            return Err(VniError::Exhausted {
                used: self.used.len(),
                total: self.total(),
            });
        }
        loop {
            let v = self.next;
            self.next = if v == self.end { self.start } else { v + 1 };
            if self.used.insert(v) {
                return Ok(v);
            }
        }
    }

    pub fn release(&mut self, vni: u32) -> bool {
        self.used.remove(&vni)
    }
}
