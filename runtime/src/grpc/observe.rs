//! `ObserveService` (logs, metrics, diagnostics, comparisons, network domains) and `TaskService`
//! (task launches, sessions, a DAG's graph): the same operations as REST's ([`crate::ops`]), their
//! documents as Structs and their streams as `StreamEvent`s.

use super::json::{from_struct, to_struct};
use super::{Api, from_pb, none_if_empty, to_pb};
use crate::ops::{self, ApiError};
use crate::pb;
use pb::observe_service_server::ObserveService;
use pb::task_service_server::TaskService;
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

pub(super) type Answer = Result<Response<pb::Document>, Status>;

/// A document as the answer, or the refusal.
pub(super) fn document(r: Result<Value, ApiError>) -> Answer {
    Ok(Response::new(pb::Document {
        document: Some(to_struct(r?)),
    }))
}

/// A request's Struct as JSON (an absent one as an empty object).
pub(super) fn body(s: Option<prost_types::Struct>) -> Value {
    s.map(from_struct).unwrap_or_else(|| Value::Object(Default::default()))
}

/// A JSON body as the type REST decodes it into: a refusal names the field as REST's does.
pub(super) fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Status> {
    serde_json::from_value(v).map_err(|e| {
        let msg = e.to_string();
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.contains("field"))
            .unwrap_or("body");
        Status::invalid_argument(format!("{field}: {msg}"))
    })
}

pub type Events = ReceiverStream<Result<pb::StreamEvent, Status>>;

/// A relay's events as a gRPC stream; it ends when the relay does, the client goes away, or `until`
/// (the token's expiry: UNAUTHENTICATED "token expired").
fn event_stream<F, Fut>(until: Option<tokio::time::Instant>, relay: F) -> Events
where
    F: FnOnce(ops::EventTx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (etx, mut erx) = tokio::sync::mpsc::channel(16);
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let producer = relay(etx);
    let last = tx.clone();
    tokio::spawn(async move {
        let run = async move {
            let forward = async move {
                while let Some((event, data)) = erx.recv().await {
                    let ev = pb::StreamEvent {
                        event: event.to_string(),
                        data: Some(to_struct(data)),
                    };
                    if tx.send(Ok(ev)).await.is_err() {
                        break;
                    }
                }
            };
            tokio::join!(producer, forward);
        };
        match until {
            None => run.await,
            Some(deadline) => {
                if tokio::time::timeout_at(deadline, run).await.is_err() {
                    let _ = last.send(Err(Status::unauthenticated("token expired"))).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

fn metrics_query(r: &pb::MetricsRequest) -> ops::MetricsQuery {
    ops::MetricsQuery {
        mode: none_if_empty(r.mode.clone()),
        duration: none_if_empty(r.duration.clone()),
        metrics: none_if_empty(r.metrics.clone()),
    }
}

#[tonic::async_trait]
impl ObserveService for Api {
    async fn get_logs(&self, req: Request<pb::LogsRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let q = ops::LogsQuery {
            node: none_if_empty(r.node),
            stream: none_if_empty(r.stream),
            offset: r.offset,
            limit: r.limit,
            since: none_if_empty(r.since),
            until: none_if_empty(r.until),
        };
        document(ops::logs_document(&self.shared, &p, &r.id, &q).await)
    }

    async fn live_logs(&self, req: Request<pb::LiveLogsRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let q = ops::LiveQuery {
            after: none_if_empty(r.after),
            stream: none_if_empty(r.stream),
        };
        document(ops::live_logs_document(&self.shared, &p, &r.id, &q).await)
    }

    type StreamLogsStream = Events;

    async fn stream_logs(&self, req: Request<pb::LiveLogsRequest>) -> Result<Response<Events>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let q = ops::LiveQuery {
            after: none_if_empty(r.after),
            stream: none_if_empty(r.stream),
        };
        let (stream, after) = ops::open_log_stream(&self.shared, &p, &r.id, &q).await?;
        let s = self.shared.clone();
        let until = p.stream_deadline();
        Ok(Response::new(event_stream(until, move |tx| {
            ops::relay_logs(s, p, r.id, stream, after, tx)
        })))
    }

    async fn query_metrics(&self, req: Request<pb::MetricsRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        document(ops::metrics_document(&self.shared, &p, &r.id, &metrics_query(&r)).await)
    }

    type StreamMetricsStream = Events;

    async fn stream_metrics(&self, req: Request<pb::MetricsRequest>) -> Result<Response<Events>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        ops::open_metrics_stream(&self.shared, &p, &r.id).await?;
        let s = self.shared.clone();
        let until = p.stream_deadline();
        let metrics = none_if_empty(r.metrics);
        Ok(Response::new(event_stream(until, move |tx| {
            ops::relay_metrics(s, p, r.id, metrics, tx)
        })))
    }

    async fn diagnostics(&self, req: Request<pb::MetricsRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let part = none_if_empty(r.part.clone());
        document(ops::diagnostics_document(&self.shared, &p, &r.id, part.as_deref(), &metrics_query(&r)).await)
    }

    async fn compare(&self, req: Request<pb::CompareRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let q = ops::CompareQuery {
            ids: Some(r.ids.join(",")),
            metrics: none_if_empty(r.metrics),
            align: none_if_empty(r.align),
            step: none_if_empty(r.step),
        };
        document(ops::compare_document(&self.shared, &p, &q).await)
    }

    async fn network_domains(&self, req: Request<pb::NetworkDomainsRequest>) -> Answer {
        let p = self.principal(&req)?;
        document(Ok(ops::network_domains(&self.shared, &p).await))
    }
}

#[tonic::async_trait]
impl TaskService for Api {
    async fn launch_tasks(&self, req: Request<pb::LaunchTasksRequest>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let t = lattice_control::tasks::TaskRequest {
            entrypoint: r.entrypoint,
            ntasks: r.ntasks,
            tasks_per_node: r.tasks_per_node,
            env: r.env.into_iter().collect(),
            pmi: none_if_empty(r.pmi),
            fence_timeout: none_if_empty(r.fence_timeout),
        };
        let v = ops::launch_tasks(&self.shared, &p, &r.id, &t).await?;
        document(serde_json::to_value(v).map_err(|e| ApiError::Unavailable { message: e.to_string() }))
    }

    async fn list_tasks(&self, req: Request<pb::AllocationRef>) -> Answer {
        let p = self.principal(&req)?;
        let v = ops::task_launches(&self.shared, &p, &req.into_inner().id).await?;
        document(Ok(serde_json::json!({ "launches": v })))
    }

    async fn get_task(&self, req: Request<pb::TaskRef>) -> Answer {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let v = ops::task_launch(&self.shared, &p, &r.id, &r.launch).await?;
        document(serde_json::to_value(v).map_err(|e| ApiError::Unavailable { message: e.to_string() }))
    }

    async fn create_session(
        &self,
        req: Request<pb::AllocationRequest>,
    ) -> Result<Response<pb::SessionResponse>, Status> {
        let p = self.principal(&req)?;
        let r = from_pb(req.into_inner())?;
        let session = ops::SessionRequest {
            tenant: r.tenant,
            project: r.project,
            vcluster: r.vcluster,
            user: r.user,
            resources: Some(r.resources),
            lifecycle: r.lifecycle,
            environment: r.environment,
            tags: r.tags,
        };
        let id = ops::create_session(&self.shared, &p, session).await?;
        Ok(Response::new(pb::SessionResponse {
            session_id: id.clone(),
            allocation_id: id,
        }))
    }

    async fn get_session(&self, req: Request<pb::SessionRef>) -> Result<Response<pb::Allocation>, Status> {
        let p = self.principal(&req)?;
        let v = ops::session(&self.shared, &p, &req.into_inner().id).await?;
        Ok(Response::new(to_pb(v)))
    }

    async fn delete_session(&self, req: Request<pb::SessionRef>) -> Result<Response<pb::CancelResponse>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        let v = ops::delete_session(&self.shared, &p, &id).await?;
        Ok(Response::new(pb::CancelResponse {
            id,
            state: v["state"].as_str().unwrap_or_default().to_string(),
        }))
    }

    async fn dag_graph(&self, req: Request<pb::DagRequest>) -> Answer {
        let p = self.principal(&req)?;
        document(ops::dag_graph(&self.shared, &p, &req.into_inner().id).await)
    }
}
