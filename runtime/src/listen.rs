//! Where the runtime's two ports accept connections: a TCP listener, or any other source of byte
//! streams behind [`Acceptor`] (the deterministic simulation's network, `lattice-dst`). The server
//! serves both the same way and never learns which one it has.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream a port accepted.
pub trait Conn: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Conn for T {}

/// What [`Acceptor::accept`] returns: the next connection and its peer's address.
pub type Accepted<'a> = Pin<Box<dyn Future<Output = std::io::Result<(Box<dyn Conn>, SocketAddr)>> + Send + 'a>>;

/// A source of connections other than a TCP listener.
pub trait Acceptor: Send + 'static {
    /// The next connection.
    fn accept(&mut self) -> Accepted<'_>;
    /// The address the port is bound to.
    fn local_addr(&self) -> std::io::Result<SocketAddr>;
}

/// A port to serve on.
pub enum Listen {
    Tcp(tokio::net::TcpListener),
    Other(Box<dyn Acceptor>),
}

impl Listen {
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Listen::Tcp(l) => l.local_addr(),
            Listen::Other(l) => l.local_addr(),
        }
    }
}

/// An accepted connection, as tonic's and axum's servers want it.
pub struct Io(Box<dyn Conn>);

impl AsyncRead for Io {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Io {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Io {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// The connections `acceptor` accepts, for tonic's `serve_with_incoming`.
pub fn incoming(
    mut acceptor: Box<dyn Acceptor>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Io>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = acceptor.accept().await.map(|(s, _)| Io(s));
            if tx.send(accepted).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// An [`Acceptor`] as `axum::serve` wants it (a failed accept is retried after 10 ms).
pub struct Rest(pub Box<dyn Acceptor>);

impl axum::serve::Listener for Rest {
    type Io = Io;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((s, a)) => return (Io(s), a),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}
