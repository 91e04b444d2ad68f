//! The Slingshot fabric-manager client (CXI services: create at launch start, auth key, revoke at
//! launch end) over [`crate::http`]; the VNI pool network domains draw from (book: "Network
//! Domains": sequential allocation from `vni_pool_start..=vni_pool_end`, freed VNIs return to the
//! pool, exhaustion is an error that says so).

use crate::http::{Http, HttpConfig, HttpError};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;

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

/// The VNI pool is the controller's (both worlds refuse the same starts when it is exhausted).
pub use lattice_engine::network::{VniError, VniPool};
