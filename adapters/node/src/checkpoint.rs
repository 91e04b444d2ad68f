//! The client side of the gRPC checkpoint callback (book: "Checkpoint Broker", application protocol,
//! mode 3; `proto/checkpoint.proto`): the node agent calls an agent-aware application's endpoint when
//! a checkpoint is requested. The application answers first with its estimate or a deferral request,
//! then streams progress until done. Every wait is bounded: the first answer by `answer_within`, the
//! whole checkpoint by `deadline`. Blocking (the agent is not async): each call runs on its own small
//! tokio runtime.

use std::time::Duration;

pub mod pb {
    tonic::include_proto!("lattice.checkpoint.v1");
}

/// How a callback ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// The application asks to be called again in this many seconds.
    Deferred(u32),
    /// It checkpointed (its first estimate, and how many progress messages came).
    Completed { estimated_s: u32, updates: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    #[error("checkpoint callback {endpoint}: cannot connect: {message}")]
    Connect { endpoint: String, message: String },
    #[error("checkpoint callback {endpoint}: no answer within {waited:?}")]
    NoAnswer { endpoint: String, waited: Duration },
    #[error("checkpoint callback {endpoint}: not done within the deadline ({deadline:?}; last at {percent} %)")]
    Deadline {
        endpoint: String,
        deadline: Duration,
        percent: u32,
    },
    #[error("checkpoint callback {endpoint}: {status}")]
    Status { endpoint: String, status: String },
    #[error("checkpoint callback {endpoint}: the stream ended before the checkpoint was done")]
    Ended { endpoint: String },
}

/// Calls `endpoint` (`host:port` or a URL) for `allocation`: the first answer within `answer_within`,
/// completion within `deadline`.
pub fn call(
    endpoint: &str,
    allocation: &str,
    forced: bool,
    answer_within: Duration,
    deadline: Duration,
) -> Result<CallbackOutcome, CallbackError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CallbackError::Connect {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })?;
    rt.block_on(call_async(endpoint, allocation, forced, answer_within, deadline))
}

async fn call_async(
    endpoint: &str,
    allocation: &str,
    forced: bool,
    answer_within: Duration,
    deadline: Duration,
) -> Result<CallbackOutcome, CallbackError> {
    let ep = endpoint.to_string();
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let connect_err = |message: String| CallbackError::Connect {
        endpoint: ep.clone(),
        message,
    };
    let channel = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| connect_err(e.to_string()))?
        .connect_timeout(answer_within)
        .connect()
        .await
        .map_err(|e| connect_err(e.to_string()))?;
    let mut client = pb::checkpoint_callback_client::CheckpointCallbackClient::new(channel);
    let started = tokio::time::Instant::now();
    let request = pb::CheckpointRequest {
        allocation_id: allocation.to_string(),
        forced,
        deadline_s: deadline.as_secs() as u32,
    };
    let status = |s: tonic::Status| CallbackError::Status {
        endpoint: ep.clone(),
        status: format!("{:?}: {}", s.code(), s.message()),
    };
    let no_answer = || CallbackError::NoAnswer {
        endpoint: ep.clone(),
        waited: answer_within,
    };
    let first = tokio::time::timeout(answer_within, async {
        let mut stream = client.checkpoint(request).await.map_err(status)?.into_inner();
        let first = stream.message().await.map_err(status)?;
        Ok::<_, CallbackError>((stream, first))
    })
    .await
    .map_err(|_| no_answer())??;
    let (mut stream, Some(first)) = first else {
        return Err(CallbackError::Ended { endpoint: ep });
    };
    if first.defer_s > 0 && !forced {
        return Ok(CallbackOutcome::Deferred(first.defer_s));
    }
    let estimated_s = first.estimated_s;
    let mut updates = 1;
    let mut percent = first.percent;
    let mut done = first.done;
    while !done {
        let left = deadline.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.message()).await {
            Err(_) => {
                return Err(CallbackError::Deadline {
                    endpoint: ep,
                    deadline,
                    percent,
                });
            }
            Ok(Err(s)) => return Err(status(s)),
            Ok(Ok(None)) => return Err(CallbackError::Ended { endpoint: ep }),
            Ok(Ok(Some(m))) => {
                updates += 1;
                percent = m.percent;
                done = m.done;
            }
        }
    }
    Ok(CallbackOutcome::Completed { estimated_s, updates })
}

/// The application's side, for Rust applications (and tests): serves the callback on `listener`,
/// answering each request with the messages `respond` returns, `pace` apart (the stream stays open
/// after a last message that is neither done nor a deferral).
pub type Respond = dyn Fn(&pb::CheckpointRequest) -> Vec<pb::CheckpointProgress> + Send + Sync;

struct App {
    respond: std::sync::Arc<Respond>,
    pace: Duration,
}

#[tonic::async_trait]
impl pb::checkpoint_callback_server::CheckpointCallback for App {
    type CheckpointStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CheckpointProgress, tonic::Status>> + Send>>;

    async fn checkpoint(
        &self,
        req: tonic::Request<pb::CheckpointRequest>,
    ) -> Result<tonic::Response<Self::CheckpointStream>, tonic::Status> {
        let msgs = (self.respond)(req.get_ref());
        let pace = self.pace;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // A last message that is neither done nor a deferral: the application is still working, the
        // stream stays open (until the caller gives up).
        let working = msgs.last().is_some_and(|m| !m.done && m.defer_s == 0);
        tokio::spawn(async move {
            for m in msgs {
                tokio::time::sleep(pace).await;
                if tx.send(Ok(m)).await.is_err() {
                    return;
                }
            }
            if working {
                tx.closed().await;
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves the callback until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    respond: std::sync::Arc<Respond>,
    pace: Duration,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(pb::checkpoint_callback_server::CheckpointCallbackServer::new(App {
            respond,
            pace,
        }))
        .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), stop)
        .await
}

/// [`serve`] on a thread of its own (for blocking programs and tests): the address it listens on
/// (loopback, a free port). It runs until the process ends.
pub fn spawn_app_endpoint(respond: std::sync::Arc<Respond>, pace: Duration) -> std::io::Result<std::net::SocketAddr> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        if let Ok(rt) = rt {
            rt.block_on(async move {
                if let Ok(l) = tokio::net::TcpListener::from_std(std_listener) {
                    let _ = serve(l, respond, pace, std::future::pending()).await;
                }
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn progress(estimated_s: u32, percent: u32, defer_s: u32, done: bool) -> pb::CheckpointProgress {
        pb::CheckpointProgress {
            estimated_s,
            percent,
            defer_s,
            done,
        }
    }

    #[test]
    fn completion_deferral_and_every_timeout() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let addr = spawn_app_endpoint(
            Arc::new(move |r: &pb::CheckpointRequest| {
                s.lock().unwrap().push((r.allocation_id.clone(), r.forced));
                match r.allocation_id.as_str() {
                    "defers" if !r.forced => vec![progress(0, 0, 30, false)],
                    "slow" => vec![progress(60, 10, 0, false), progress(60, 20, 0, false)],
                    "silent" => vec![],
                    _ => vec![
                        progress(2, 0, 0, false),
                        progress(2, 50, 0, false),
                        progress(2, 100, 0, true),
                    ],
                }
            }),
            Duration::from_millis(20),
        )
        .unwrap();
        let ep = addr.to_string();
        let (answer, deadline) = (Duration::from_millis(500), Duration::from_millis(800));
        assert_eq!(
            call(&ep, "a-1", false, answer, deadline).unwrap(),
            CallbackOutcome::Completed {
                estimated_s: 2,
                updates: 3
            }
        );
        assert_eq!(
            call(&ep, "defers", false, answer, deadline).unwrap(),
            CallbackOutcome::Deferred(30)
        );
        // Called again as forced (the deferral ran out): the application checkpoints.
        assert!(matches!(
            call(&ep, "defers", true, answer, deadline),
            Ok(CallbackOutcome::Completed { updates: 3, .. })
        ));
        assert!(matches!(
            call(&ep, "slow", false, answer, deadline),
            Err(CallbackError::Deadline { percent: 20, .. })
        ));
        assert!(matches!(
            call(&ep, "silent", false, answer, deadline),
            Err(CallbackError::Ended { .. })
        ));
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = call(&closed.to_string(), "a-1", false, answer, deadline).unwrap_err();
        assert!(matches!(e, CallbackError::Connect { .. }), "{e}");
        assert_eq!(seen.lock().unwrap()[0], ("a-1".to_string(), false));
    }

    #[test]
    fn an_application_that_never_answers_times_out() {
        // Accepts connections but never speaks HTTP/2.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let _held: Vec<_> = l.incoming().take(4).collect();
            std::thread::sleep(Duration::from_secs(5));
        });
        let t0 = std::time::Instant::now();
        let e = call(
            &addr.to_string(),
            "a-1",
            false,
            Duration::from_millis(300),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(
            matches!(e, CallbackError::NoAnswer { .. } | CallbackError::Connect { .. }),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }
}
