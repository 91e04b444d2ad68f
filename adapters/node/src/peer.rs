//! The node agents' own gRPC service (`proto/agent.proto`; book: "MPI Process Management", Node Agent
//! gRPC Extensions): the PMI fence between the agents of one task launch (a star around the head
//! agent), aborting a launch's ranks on every node, and `Exec` for `lattice-mpi-launcher`. The agent
//! is blocking: [`Peer`] owns a small tokio runtime that serves the service and makes the calls, and
//! the agent's answers ([`PeerHandler`]) run on blocking threads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub mod pb {
    tonic::include_proto!("lattice.agent.v1");
}

/// One node's contribution to a fence of a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceIn {
    pub launch_id: String,
    pub token: String,
    pub node_index: u32,
    pub epoch: u32,
    pub puts: Vec<(String, String)>,
}

/// What `Exec` streams back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
}

/// The start of a terminal session ([`PeerHandler::attach`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttachStart {
    pub alloc: String,
    pub token: String,
    /// What to run (`sh -c`); `None`: a login shell.
    pub command: Option<String>,
    pub rows: u16,
    pub cols: u16,
    pub term: Option<String>,
}

/// What the user sends to a terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachInput {
    Stdin(Vec<u8>),
    Resize {
        rows: u16,
        cols: u16,
    },
    /// `INT`, `TSTP`, `QUIT`, `HUP`, `TERM`.
    Signal(String),
}

/// What a terminal sends back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachOutput {
    Stdout(Vec<u8>),
    Exit(i32),
    Error(String),
}

/// A terminal the agent opened: feed `input` (dropping it hangs up: SIGHUP to the session); read
/// `output` until `Exit`.
pub struct AttachSession {
    pub input: std::sync::mpsc::Sender<AttachInput>,
    pub output: std::sync::mpsc::Receiver<AttachOutput>,
}

/// The agent's side of the service. Each call may block (a fence waits for the other nodes).
pub trait PeerHandler: Send + Sync + 'static {
    /// A node's ranks entered a fence: the merged puts of every node once all are in, or why not.
    fn fence(&self, f: FenceIn) -> Result<Vec<(String, String)>, String>;
    /// Abort `launch_id`'s ranks on this node; whether this agent knows the launch.
    fn abort(&self, launch_id: &str, token: &str, reason: &str, from_node_index: u32) -> bool;
    /// Start `argv` on this node inside allocation `alloc` (checked against its token); its output and
    /// exit arrive on the receiver.
    fn exec(
        &self,
        alloc: &str,
        token: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<std::sync::mpsc::Receiver<ExecEvent>, String>;
    /// Open a terminal inside allocation `start.alloc` (checked against its token).
    fn attach(&self, start: AttachStart) -> Result<AttachSession, String>;
}

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("agent {addr}: cannot connect: {message}")]
    Connect { addr: String, message: String },
    #[error("agent {addr}: no answer within {waited:?}")]
    Timeout { addr: String, waited: Duration },
    #[error("agent {addr}: {message}")]
    Refused { addr: String, message: String },
}

struct Service(Arc<dyn PeerHandler>);

fn pairs(kv: Vec<pb::KeyValue>) -> Vec<(String, String)> {
    kv.into_iter().map(|p| (p.key, p.value)).collect()
}

fn kvs(pairs: Vec<(String, String)>) -> Vec<pb::KeyValue> {
    pairs
        .into_iter()
        .map(|(key, value)| pb::KeyValue { key, value })
        .collect()
}

fn input_of(m: pb::attach_in::Msg) -> Option<AttachInput> {
    Some(match m {
        pb::attach_in::Msg::Stdin(b) => AttachInput::Stdin(b),
        pb::attach_in::Msg::Resize(r) => AttachInput::Resize {
            rows: r.rows.min(u16::MAX as u32) as u16,
            cols: r.cols.min(u16::MAX as u32) as u16,
        },
        pb::attach_in::Msg::Signal(s) => AttachInput::Signal(s),
        pb::attach_in::Msg::Start(_) => return None,
    })
}

fn output_msg(o: AttachOutput) -> pb::attach_out::Msg {
    match o {
        AttachOutput::Stdout(b) => pb::attach_out::Msg::Stdout(b),
        AttachOutput::Exit(c) => pb::attach_out::Msg::ExitCode(c),
        AttachOutput::Error(e) => pb::attach_out::Msg::Error(e),
    }
}

type AttachOutStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::AttachOut, tonic::Status>> + Send>>;

type ExecStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ExecEvent, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl pb::node_agent_server::NodeAgent for Service {
    async fn pmi_fence(
        &self,
        req: tonic::Request<pb::PmiFenceRequest>,
    ) -> Result<tonic::Response<pb::PmiFenceResponse>, tonic::Status> {
        let r = req.into_inner();
        let h = self.0.clone();
        let f = FenceIn {
            launch_id: r.launch_id,
            token: r.token,
            node_index: r.node_index,
            epoch: r.epoch,
            puts: pairs(r.puts),
        };
        let out = tokio::task::spawn_blocking(move || h.fence(f))
            .await
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        match out {
            Ok(merged) => Ok(tonic::Response::new(pb::PmiFenceResponse { merged: kvs(merged) })),
            Err(why) => Err(tonic::Status::aborted(why)),
        }
    }

    async fn abort_processes(
        &self,
        req: tonic::Request<pb::AbortProcessesRequest>,
    ) -> Result<tonic::Response<pb::AbortProcessesResponse>, tonic::Status> {
        let r = req.into_inner();
        let h = self.0.clone();
        let known = tokio::task::spawn_blocking(move || h.abort(&r.launch_id, &r.token, &r.reason, r.from_node_index))
            .await
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::AbortProcessesResponse { known }))
    }

    type ExecStream = ExecStream;

    type AttachStream = AttachOutStream;

    async fn attach(
        &self,
        req: tonic::Request<tonic::Streaming<pb::AttachIn>>,
    ) -> Result<tonic::Response<AttachOutStream>, tonic::Status> {
        let mut inbound = req.into_inner();
        let Some(pb::AttachIn {
            msg: Some(pb::attach_in::Msg::Start(st)),
        }) = inbound.message().await?
        else {
            return Err(tonic::Status::invalid_argument("the first message must be `start`"));
        };
        let start = AttachStart {
            alloc: st.allocation_id,
            token: st.token,
            command: Some(st.command).filter(|c| !c.is_empty()),
            rows: st.rows.min(u16::MAX as u32) as u16,
            cols: st.cols.min(u16::MAX as u32) as u16,
            term: Some(st.term).filter(|t| !t.is_empty()),
        };
        let h = self.0.clone();
        let session = tokio::task::spawn_blocking(move || h.attach(start))
            .await
            .map_err(|e| tonic::Status::internal(e.to_string()))?
            .map_err(tonic::Status::permission_denied)?;
        let AttachSession { input, output } = session;
        // The user's input: relayed until the stream ends (then `input` drops: a hang-up).
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(i) = m.msg.and_then(input_of)
                    && input.send(i).is_err()
                {
                    break;
                }
            }
        });
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::task::spawn_blocking(move || {
            for o in output {
                if tx
                    .blocking_send(Ok(pb::AttachOut {
                        msg: Some(output_msg(o)),
                    }))
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn exec(&self, req: tonic::Request<pb::ExecRequest>) -> Result<tonic::Response<ExecStream>, tonic::Status> {
        let r = req.into_inner();
        let h = self.0.clone();
        let events = tokio::task::spawn_blocking(move || h.exec(&r.allocation_id, &r.token, r.argv, pairs(r.env)))
            .await
            .map_err(|e| tonic::Status::internal(e.to_string()))?
            .map_err(tonic::Status::permission_denied)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::task::spawn_blocking(move || {
            for e in events {
                let event = match e {
                    ExecEvent::Stdout(b) => pb::exec_event::Event::Stdout(b),
                    ExecEvent::Stderr(b) => pb::exec_event::Event::Stderr(b),
                    ExecEvent::Exit(c) => pb::exec_event::Event::ExitCode(c),
                };
                if tx.blocking_send(Ok(pb::ExecEvent { event: Some(event) })).is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Opens a terminal on the agent at `addr` (for the control plane, which relays a user's terminal):
/// `input` goes to it until it ends or `input` closes; what it sends comes back on the receiver,
/// ending with `Exit` or `Error`.
pub async fn attach(
    addr: &str,
    start: AttachStart,
    mut input: tokio::sync::mpsc::Receiver<AttachInput>,
) -> Result<tokio::sync::mpsc::Receiver<AttachOutput>, PeerError> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let connect = |message: String| PeerError::Connect {
        addr: addr.to_string(),
        message,
    };
    let ch = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| connect(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| connect(e.to_string()))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::AttachIn>(64);
    let first = pb::AttachIn {
        msg: Some(pb::attach_in::Msg::Start(pb::AttachStart {
            allocation_id: start.alloc,
            token: start.token,
            command: start.command.unwrap_or_default(),
            rows: start.rows as u32,
            cols: start.cols as u32,
            term: start.term.unwrap_or_default(),
        })),
    };
    let _ = tx.send(first).await;
    tokio::spawn(async move {
        while let Some(i) = input.recv().await {
            let msg = match i {
                AttachInput::Stdin(b) => pb::attach_in::Msg::Stdin(b),
                AttachInput::Resize { rows, cols } => pb::attach_in::Msg::Resize(pb::Resize {
                    rows: rows as u32,
                    cols: cols as u32,
                }),
                AttachInput::Signal(s) => pb::attach_in::Msg::Signal(s),
            };
            if tx.send(pb::AttachIn { msg: Some(msg) }).await.is_err() {
                break;
            }
        }
    });
    let mut client = pb::node_agent_client::NodeAgentClient::new(ch);
    let mut stream = client
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| PeerError::Refused {
            addr: addr.to_string(),
            message: s.message().to_string(),
        })?
        .into_inner();
    let (out_tx, out_rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let o = match stream.message().await {
                Ok(Some(pb::AttachOut { msg: Some(m) })) => match m {
                    pb::attach_out::Msg::Stdout(b) => AttachOutput::Stdout(b),
                    pb::attach_out::Msg::ExitCode(c) => AttachOutput::Exit(c),
                    pb::attach_out::Msg::Error(e) => AttachOutput::Error(e),
                },
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(s) => AttachOutput::Error(format!(
                    "connection to node lost — attach session ended ({})",
                    s.message()
                )),
            };
            let end = matches!(o, AttachOutput::Exit(_) | AttachOutput::Error(_));
            if out_tx.send(o).await.is_err() || end {
                break;
            }
        }
    });
    Ok(out_rx)
}

/// An agent's end of the service: serves its handler and calls other agents.
pub struct Peer {
    rt: tokio::runtime::Runtime,
    addr: Option<SocketAddr>,
    channels: std::sync::Mutex<std::collections::BTreeMap<String, tonic::transport::Channel>>,
}

impl Peer {
    /// A peer that only calls others (no service).
    pub fn client() -> std::io::Result<Peer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lattice-peer")
            .enable_all()
            .build()?;
        Ok(Peer {
            rt,
            addr: None,
            channels: Default::default(),
        })
    }

    /// Serves `handler` on `listen` (`host:port`; port 0 picks a free one).
    pub fn serve(listen: &str, handler: Arc<dyn PeerHandler>) -> std::io::Result<Peer> {
        let mut peer = Peer::client()?;
        let std_listener = std::net::TcpListener::bind(listen)?;
        std_listener.set_nonblocking(true)?;
        peer.addr = Some(std_listener.local_addr()?);
        let listener = peer
            .rt
            .block_on(async { tokio::net::TcpListener::from_std(std_listener) })?;
        peer.rt.spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(pb::node_agent_server::NodeAgentServer::new(Service(handler)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
            if let Err(e) = r {
                eprintln!("lattice-agent: peer service stopped: {e}");
            }
        });
        Ok(peer)
    }

    /// Where the service listens (None for a client only).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    fn channel(&self, addr: &str, within: Duration) -> Result<tonic::transport::Channel, PeerError> {
        if let Some(c) = self.channels.lock().unwrap_or_else(|e| e.into_inner()).get(addr) {
            return Ok(c.clone());
        }
        let url = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("http://{addr}")
        };
        let connect = |message: String| PeerError::Connect {
            addr: addr.to_string(),
            message,
        };
        let ch = self.rt.block_on(async {
            tonic::transport::Endpoint::from_shared(url)
                .map_err(|e| connect(e.to_string()))?
                .connect_timeout(within)
                .connect()
                .await
                .map_err(|e| connect(e.to_string()))
        })?;
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr.to_string(), ch.clone());
        Ok(ch)
    }

    fn status(&self, addr: &str, s: tonic::Status) -> PeerError {
        if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown) {
            // The connection broke: the next call connects afresh.
            self.channels.lock().unwrap_or_else(|e| e.into_inner()).remove(addr);
        }
        PeerError::Refused {
            addr: addr.to_string(),
            message: s.message().to_string(),
        }
    }

    /// A unary call's answer, its refusal, or its running out of time (`within`).
    fn settle<T>(
        &self,
        addr: &str,
        within: Duration,
        r: Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>,
    ) -> Result<T, PeerError> {
        match r {
            Err(_) => Err(PeerError::Timeout {
                addr: addr.to_string(),
                waited: within,
            }),
            Ok(Err(s)) => Err(self.status(addr, s)),
            Ok(Ok(resp)) => Ok(resp.into_inner()),
        }
    }

    /// Sends this node's contribution to the head agent at `addr`; the merged puts within `within`.
    pub fn fence(&self, addr: &str, f: FenceIn, within: Duration) -> Result<Vec<(String, String)>, PeerError> {
        let ch = self.channel(addr, within)?;
        let req = pb::PmiFenceRequest {
            launch_id: f.launch_id,
            token: f.token,
            node_index: f.node_index,
            epoch: f.epoch,
            puts: kvs(f.puts),
        };
        let r = self.rt.block_on(async {
            let mut c = pb::node_agent_client::NodeAgentClient::new(ch);
            tokio::time::timeout(within, c.pmi_fence(req)).await
        });
        self.settle(addr, within, r).map(|resp| pairs(resp.merged))
    }

    /// Asks the agent at `addr` to abort `launch_id`'s ranks; whether it knew the launch.
    pub fn abort(
        &self,
        addr: &str,
        launch_id: &str,
        token: &str,
        reason: &str,
        from_node_index: u32,
        within: Duration,
    ) -> Result<bool, PeerError> {
        let ch = self.channel(addr, within)?;
        let req = pb::AbortProcessesRequest {
            launch_id: launch_id.to_string(),
            token: token.to_string(),
            reason: reason.to_string(),
            from_node_index,
        };
        let r = self.rt.block_on(async {
            let mut c = pb::node_agent_client::NodeAgentClient::new(ch);
            tokio::time::timeout(within, c.abort_processes(req)).await
        });
        self.settle(addr, within, r).map(|resp| resp.known)
    }

    /// Runs `argv` inside allocation `alloc` on the agent at `addr`; `event` gets its output as it
    /// comes. Returns its exit code.
    pub fn exec(
        &self,
        addr: &str,
        alloc: &str,
        token: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        mut event: impl FnMut(ExecEvent),
    ) -> Result<i32, PeerError> {
        let ch = self.channel(addr, Duration::from_secs(10))?;
        let req = pb::ExecRequest {
            allocation_id: alloc.to_string(),
            token: token.to_string(),
            argv,
            env: kvs(env),
        };
        self.rt.block_on(async {
            let mut c = pb::node_agent_client::NodeAgentClient::new(ch);
            let mut stream = c.exec(req).await.map_err(|s| self.status(addr, s))?.into_inner();
            while let Some(m) = stream.message().await.map_err(|s| self.status(addr, s))? {
                match m.event {
                    Some(pb::exec_event::Event::Stdout(b)) => event(ExecEvent::Stdout(b)),
                    Some(pb::exec_event::Event::Stderr(b)) => event(ExecEvent::Stderr(b)),
                    Some(pb::exec_event::Event::ExitCode(c)) => return Ok(c),
                    None => {}
                }
            }
            Err(PeerError::Refused {
                addr: addr.to_string(),
                message: "the stream ended without an exit code".into(),
            })
        })
    }
}
