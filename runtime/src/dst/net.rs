//! The runtime on turmoil's simulated network: the gRPC port's incoming connections, the REST
//! listener axum serves, and the dialer tonic channels (Raft, the queue mirror, clients) connect
//! through. Nothing else in the runtime knows it is simulated.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A simulated TCP connection, as tonic's server wants it.
pub struct Io(turmoil::net::TcpStream);

impl AsyncRead for Io {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Io {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Io {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// The connections accepted on `listener`, for `serve_with_incoming`.
pub fn incoming(
    listener: turmoil::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<Io>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await.map(|(s, _)| Io(s));
            if tx.send(accepted).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The REST port on the simulated network, for `axum::serve`.
pub struct Rest(pub turmoil::net::TcpListener);

impl axum::serve::Listener for Rest {
    type Io = turmoil::net::TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
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
