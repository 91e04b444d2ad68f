//! The Waldur accounting client (book: "Accounting"): each accounting event is reported as a
//! resource usage order (`POST /api/marketplace-orders/`), and a finished allocation's consumption
//! also becomes a billing line item on its customer's pending invoice
//! (`POST /api/invoices/{id}/items/`, the invoice found with `GET /api/invoices/?customer=…&state=pending`).
//!
//! Entity mapping (the book's table): a tenant is a Waldur customer, a project a project, a
//! vCluster an offering, an allocation an order. Every request carries the event's idempotency key
//! (`Idempotency-Key`), the same however often the event is sent — after a timeout whose request did
//! arrive, from a replayed disk buffer, from a new leader, or from a reconcile — so Waldur records
//! each event once; a `409 Conflict` (already recorded) counts as delivered. Waldur authenticates
//! with `Authorization: Token …`.

use crate::http::{Http, HttpConfig, HttpError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// One accounting event (book: "Accounting Events").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccountingEvent {
    /// Its idempotency key: derived from what it reports, so the same event always has the same key.
    pub key: String,
    /// `allocation.started`, `allocation.completed`, `allocation.checkpointed`, `node.claimed`,
    /// `node.released`.
    pub event: String,
    /// When it happened (ms since the epoch).
    pub at_ms: u64,
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcluster: Option<String>,
    /// The event's own fields (the book's payload column).
    #[serde(default)]
    pub payload: Value,
}

/// What Waldur did with an event.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// It had recorded this key already.
    pub duplicate: bool,
    /// The invoice a billing line item went to (completed allocations with a pending invoice).
    pub invoice: Option<String>,
}

pub struct Waldur {
    http: Http,
    /// Customer → its pending invoice's uuid.
    invoices: tokio::sync::Mutex<BTreeMap<String, String>>,
}

fn accepted(r: Result<Value, HttpError>) -> Result<bool, HttpError> {
    match r {
        Ok(_) => Ok(false),
        Err(HttpError::Status { status: 409, .. }) => Ok(true),
        Err(e) => Err(e),
    }
}

impl Waldur {
    /// `cfg.base` is the API root, e.g. `https://waldur.example.com` (a trailing `/api/` is accepted).
    pub fn new(mut cfg: HttpConfig) -> Result<Waldur, HttpError> {
        cfg.base = cfg.base.trim_end_matches('/').trim_end_matches("/api").to_string();
        cfg.auth_scheme = "Token".into();
        Ok(Waldur {
            http: Http::new(cfg)?,
            invoices: Default::default(),
        })
    }

    /// Reports `e` with the API token `token` (read from the secret just before, so a rotation is
    /// picked up).
    pub async fn push(&self, e: &AccountingEvent, token: Option<&str>) -> Result<Delivery, HttpError> {
        let mut attributes = json!({
            "event": e.event,
            "idempotency_key": e.key,
            "at_ms": e.at_ms,
            "allocation": e.allocation,
            "user": e.user,
        });
        if let (Some(a), Some(p)) = (attributes.as_object_mut(), e.payload.as_object()) {
            a.extend(p.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let order = json!({
            "type": "usage",
            "customer": e.tenant,
            "project": e.project.as_deref().unwrap_or("default"),
            "offering": e.vcluster,
            "attributes": attributes,
        });
        let headers = [("Idempotency-Key", e.key.as_str())];
        let post = reqwest::Method::POST;
        let duplicate = accepted(
            self.http
                .call_with(post.clone(), "/api/marketplace-orders/", Some(&order), &headers, token)
                .await,
        )?;
        let mut invoice = None;
        if e.event == "allocation.completed" {
            invoice = self.bill(e, token).await?;
        }
        Ok(Delivery { duplicate, invoice })
    }

    /// A finished allocation's line item on its customer's pending invoice (none pending: none).
    async fn bill(&self, e: &AccountingEvent, token: Option<&str>) -> Result<Option<String>, HttpError> {
        let gpu_hours = e.payload["gpu_hours"].as_f64().unwrap_or(0.0);
        let (quantity, unit) = if gpu_hours > 0.0 {
            (gpu_hours, "gpu_hour")
        } else {
            (e.payload["node_hours"].as_f64().unwrap_or(0.0), "node_hour")
        };
        let item = json!({
            "name": format!("{} {}", e.vcluster.as_deref().unwrap_or("lattice"), e.allocation.as_deref().unwrap_or("")),
            "unit": unit,
            "quantity": quantity,
            "project": e.project.as_deref().unwrap_or("default"),
            "details": e.payload,
        });
        let key = format!("{}/item", e.key);
        let headers = [("Idempotency-Key", key.as_str())];
        for fresh in [false, true] {
            let Some(invoice) = self.pending_invoice(&e.tenant, token, fresh).await? else {
                return Ok(None);
            };
            let path = format!("/api/invoices/{invoice}/items/");
            match self
                .http
                .call_with(reqwest::Method::POST, &path, Some(&item), &headers, token)
                .await
            {
                // The invoice was closed meanwhile: look the pending one up again.
                Err(err) if err.is_not_found() && !fresh => {
                    self.invoices.lock().await.remove(&e.tenant);
                }
                r => {
                    accepted(r)?;
                    return Ok(Some(invoice));
                }
            }
        }
        Ok(None)
    }

    async fn pending_invoice(
        &self,
        customer: &str,
        token: Option<&str>,
        fresh: bool,
    ) -> Result<Option<String>, HttpError> {
        if !fresh && let Some(i) = self.invoices.lock().await.get(customer) {
            return Ok(Some(i.clone()));
        }
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("customer", customer)
            .append_pair("state", "pending")
            .finish();
        let v = self
            .http
            .call_with(reqwest::Method::GET, &format!("/api/invoices/?{q}"), None, &[], token)
            .await?;
        let uuid = v
            .as_array()
            .and_then(|a| a.first())
            .and_then(|i| i["uuid"].as_str())
            .map(str::to_string);
        if let Some(u) = &uuid {
            self.invoices.lock().await.insert(customer.to_string(), u.clone());
        }
        Ok(uuid)
    }
}
