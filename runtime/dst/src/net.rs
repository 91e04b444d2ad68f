//! The runtime on turmoil's simulated network: the ports' listeners (an [`Acceptor`] the server
//! serves like a TCP listener) and the dialer tonic channels (Raft, the queue mirror, clients)
//! connect through. Nothing in the runtime knows it is simulated.

use lattice_runtime::listen::{Accepted, Acceptor, Conn};

/// A port on the simulated network.
pub struct SimListener(pub turmoil::net::TcpListener);

impl Acceptor for SimListener {
    fn accept(&mut self) -> Accepted<'_> {
        Box::pin(async move {
            let (s, addr) = self.0.accept().await?;
            Ok((Box::new(s) as Box<dyn Conn>, addr))
        })
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }
}

/// Channels to `host:port` endpoints over the simulated network (lazily connected, like production's).
pub fn dialer() -> lattice_adapters::raft_net::Dialer {
    std::sync::Arc::new(|endpoint: tonic::transport::Endpoint| {
        endpoint.connect_with_connector_lazy(tower::service_fn(|uri: tonic::transport::Uri| async move {
            let host = uri.host().unwrap_or_default().to_string();
            let port = uri.port_u16().unwrap_or(80);
            let s = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
        }))
    })
}
