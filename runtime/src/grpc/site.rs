//! `SiteService`: the site's administration over gRPC (health, auth discovery, tenant and project
//! reads, accounting, the administrative log, site settings, vCluster configuration, restore,
//! membership, image caches, fingerprints, wipes) and the agents' work polls and exits — the same
//! operations as REST's ([`crate::ops`]), their answers as REST's documents.

use super::Api;
use super::observe::{Answer, body, decode, document};
use crate::ops::{self, ApiError};
use crate::pb;
use pb::site_service_server::SiteService;
use serde_json::{Map, Value, json};
use tonic::Request;

fn as_value<T: serde::Serialize>(v: T) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::Unavailable { message: e.to_string() })
}

/// A write's configuration keys (a Struct) as REST's body map.
fn config(c: Option<prost_types::Struct>) -> Map<String, Value> {
    match body(c) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn cache_request(r: pb::CacheOrderRequest) -> lattice_control::cache::CacheRequest {
    lattice_control::cache::CacheRequest {
        image: r.image,
        nodes: r.nodes,
        group: r.group,
        sticky: r.sticky,
    }
}

impl Api {
    async fn cache(&self, req: Request<pb::CacheOrderRequest>, op: &str) -> Answer {
        let p = self.principal(&req)?;
        let r = cache_request(req.into_inner());
        let nodes = ops::cache_order(&self.shared, &p, op, &r).await?;
        document(Ok(json!({"op": op, "image": r.image, "nodes": nodes})))
    }
}

#[tonic::async_trait]
impl SiteService for Api {
    async fn health(&self, _req: Request<pb::Empty>) -> Answer {
        let st = self.shared.member.status();
        document(Ok(
            json!({"status": "ok", "raft_state": st.state, "leader": st.leader, "term": st.term}),
        ))
    }

    async fn export_audit(&self, req: Request<pb::AuditQueryRequest>) -> Answer {
        let p = self.principal(&req)?;
        let q = super::audit_query(req.into_inner());
        document(ops::audit_export(&self.shared, &p, &q).await.and_then(as_value))
    }

    async fn auth_discovery(&self, _req: Request<pb::Empty>) -> Answer {
        document(Ok(self.shared.auth.discovery()))
    }

    async fn get_tenant(&self, req: Request<pb::TenantRequest>) -> Answer {
        let p = self.principal(&req)?;
        document(ops::tenant_document(&self.shared, &p, &req.into_inner().name).await)
    }

    async fn get_project(&self, req: Request<pb::ProjectRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        document(ops::project_document(&self.shared, &p, &r.tenant, &r.name).await)
    }

    async fn accounting(&self, req: Request<pb::UsageRequest>) -> Answer {
        let p = self.principal(&req)?;
        let q = super::usage_query(req.into_inner());
        let (total, records) = ops::accounting(&self.shared, &p, &q).await?;
        document(Ok(json!({"total": total, "records": records})))
    }

    async fn admin_log(&self, req: Request<pb::Empty>) -> Answer {
        let p = self.principal(&req)?;
        document(ops::admin_log(&self.shared, &p).await)
    }

    async fn accounting_status(&self, req: Request<pb::Empty>) -> Answer {
        let p = self.principal(&req)?;
        let st = crate::accounting::service::status(&self.shared, &p).await?;
        document(as_value(st))
    }

    async fn reconcile_accounting(&self, req: Request<pb::ReconcileRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let w = crate::accounting::ReconcileIn {
            since: r.since,
            until: r.until,
        };
        let done = crate::accounting::service::reconcile_window(&self.shared, &p, &w).await?;
        document(as_value(done))
    }

    async fn get_settings(&self, req: Request<pb::Empty>) -> Answer {
        self.principal(&req)?;
        document(ops::settings(&self.shared).await)
    }

    async fn set_settings(&self, req: Request<pb::ConfigWrite>) -> Answer {
        let p = self.principal(&req)?;
        let changes = config(req.into_inner().config);
        document(ops::put_settings(&self.shared, &p, &changes).await)
    }

    async fn create_v_cluster(&self, req: Request<pb::ConfigWrite>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        document(ops::put_vcluster(&self.shared, &p, &r.name, &config(r.config), true).await)
    }

    async fn get_v_cluster(&self, req: Request<pb::VClusterRef>) -> Answer {
        self.principal(&req)?;
        document(ops::vcluster(&self.shared, &req.into_inner().name).await)
    }

    async fn configure_v_cluster(&self, req: Request<pb::ConfigWrite>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        document(ops::put_vcluster(&self.shared, &p, &r.name, &config(r.config), false).await)
    }

    async fn restore(&self, req: Request<pb::RestoreRequest>) -> Answer {
        let p = self.principal(&req)?;
        document(ops::restore(&self.shared, &p, Some(&req.into_inner().path)).await)
    }

    async fn add_member(&self, req: Request<pb::MemberRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        document(ops::add_member(&self.shared, &p, r.id, &r.addr).await)
    }

    async fn remove_member(&self, req: Request<pb::MemberRequest>) -> Answer {
        let p = self.principal(&req)?;
        document(ops::remove_member(&self.shared, &p, req.into_inner().id).await)
    }

    async fn list_cache(&self, req: Request<pb::CacheListRequest>) -> Answer {
        let p = self.principal(&req)?;
        let node = super::none_if_empty(req.into_inner().node);
        let v = ops::cache_list(&self.shared, &p, node.as_deref()).await?;
        document(Ok(json!({ "nodes": v })))
    }

    async fn warm_cache(&self, req: Request<pb::CacheOrderRequest>) -> Answer {
        self.cache(req, "warm").await
    }

    async fn evict_cache(&self, req: Request<pb::CacheOrderRequest>) -> Answer {
        self.cache(req, "evict").await
    }

    async fn request_fingerprint(&self, req: Request<pb::NodeRequest>) -> Answer {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::ask_fingerprint(&self.shared, &p, &id).await?;
        document(Ok(json!({"node": id, "fingerprint": "requested"})))
    }

    async fn retry_wipe(&self, req: Request<pb::WipeRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let claim = ops::retry_wipe(&self.shared, &p, &r.node, r.force).await?;
        document(Ok(json!({"node": r.node, "claim": claim, "wiping": true})))
    }

    async fn work(&self, req: Request<pb::AgentCall>) -> Answer {
        let p = self.agent_principal(&req)?;
        let r = req.into_inner();
        let poll: lattice_agent_protocol::WorkPoll = decode(body(r.body))?;
        document(ops::work_poll(&self.shared, &p, &r.id, poll).await)
    }

    async fn report_exit(&self, req: Request<pb::AgentCall>) -> Answer {
        let p = self.agent_principal(&req)?;
        let r = req.into_inner();
        let x: lattice_agent_protocol::ExitReport = decode(body(r.body))?;
        document(ops::exit_report(&self.shared, &p, &r.id, &x).await)
    }
}
