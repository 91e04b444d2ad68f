//! `FederationService`: federation's user and administrator calls over gRPC. Each call runs the
//! REST handler itself (one implementation of each operation) and turns its answer into a
//! [`pb::Document`], or its refusal (status and `{"error", "field"}`) into the matching gRPC status.

use crate::grpc::Api;
use crate::grpc::json::{from_struct, to_struct};
use crate::pb;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, body::Bytes};
use pb::federation_service_server::FederationService;
use serde_json::{Value, json};
use tonic::{Code, Request, Status};

type Answer = Result<tonic::Response<pb::Document>, Status>;

/// The gRPC code of a REST status.
fn code(status: StatusCode) -> Code {
    match status.as_u16() {
        400 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        421 => Code::FailedPrecondition,
        429 => Code::ResourceExhausted,
        502..=504 => Code::Unavailable,
        _ => Code::Internal,
    }
}

/// A REST handler's answer as a document, or its refusal as a status (`field: message`).
async fn answer(r: Response) -> Answer {
    let status = r.status();
    let bytes = axum::body::to_bytes(r.into_body(), 64 << 20)
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
    let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({"text": String::from_utf8_lossy(&bytes)}));
    if status.is_success() {
        return Ok(tonic::Response::new(pb::Document {
            document: Some(to_struct(v)),
        }));
    }
    let message = v["error"].as_str().map_or_else(|| v.to_string(), str::to_string);
    let message = match v["field"].as_str() {
        Some(f) => format!("{f}: {message}"),
        None => message,
    };
    Err(Status::new(code(status), message))
}

#[tonic::async_trait]
impl FederationService for Api {
    async fn submit(&self, req: Request<pb::FederatedSubmit>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let request = r.request.map(from_struct).unwrap_or(Value::Null);
        let body = json!({"site": r.site, "request": request}).to_string();
        answer(super::api::submit(State(self.shared.clone()), Extension(p), Bytes::from(body)).await).await
    }

    async fn list_remote(&self, req: Request<pb::RemoteListRequest>) -> Answer {
        let p = self.principal(&req)?;
        let site = crate::grpc::none_if_empty(req.into_inner().site);
        let q = Query(super::api::ListIn { site });
        answer(super::api::list_remote(State(self.shared.clone()), Extension(p), q).await).await
    }

    async fn ended(&self, req: Request<pb::Empty>) -> Answer {
        let p = self.principal(&req)?;
        answer(super::api::ended(State(self.shared.clone()), Extension(p)).await).await
    }

    async fn get_remote(&self, req: Request<pb::RemoteRef>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        answer(super::api::get_remote(State(self.shared.clone()), Extension(p), Path((r.site, r.id))).await).await
    }

    async fn cancel_remote(&self, req: Request<pb::RemoteRef>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        answer(super::api::cancel_remote(State(self.shared.clone()), Extension(p), Path((r.site, r.id))).await).await
    }

    async fn remote_logs(&self, req: Request<pb::RemoteRef>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        answer(super::api::logs_remote(State(self.shared.clone()), Extension(p), Path((r.site, r.id))).await).await
    }

    async fn status(&self, req: Request<pb::Empty>) -> Answer {
        let p = self.principal(&req)?;
        answer(super::api::status(State(self.shared.clone()), Extension(p)).await).await
    }

    async fn add_peer(&self, req: Request<pb::PeerRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let body = json!({"name": r.name, "endpoints": r.endpoints, "workspace": r.workspace}).to_string();
        answer(super::api::add_peer(State(self.shared.clone()), Extension(p), Bytes::from(body)).await).await
    }

    async fn remove_peer(&self, req: Request<pb::PeerRef>) -> Answer {
        let p = self.principal(&req)?;
        let name = req.into_inner().name;
        answer(super::api::remove_peer(State(self.shared.clone()), Extension(p), Path(name)).await).await
    }

    async fn revoke_workspace(&self, req: Request<pb::WorkspaceRef>) -> Answer {
        let p = self.principal(&req)?;
        let ws = req.into_inner().workspace;
        answer(super::api::revoke(State(self.shared.clone()), Extension(p), Path(ws)).await).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refusals_become_statuses_naming_the_field() {
        use axum::response::IntoResponse;
        let r = (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "at least one endpoint", "field": "endpoint"})),
        )
            .into_response();
        let e = answer(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(e.message(), "endpoint: at least one endpoint");
        let r = (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": "federation is not enabled"})),
        )
            .into_response();
        assert_eq!(answer(r).await.unwrap_err().code(), Code::NotFound);
        let ok = axum::Json(json!({"site": "b", "id": "x-1"})).into_response();
        let d = answer(ok).await.unwrap().into_inner().document.unwrap();
        assert_eq!(from_struct(d), json!({"site": "b", "id": "x-1"}));
    }
}
