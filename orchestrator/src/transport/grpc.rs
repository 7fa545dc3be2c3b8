//! The gRPC door's connections: admitted under its cap and handed to tonic.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tonic::transport::server::Connected;

use super::{Gate, Lifecycle, TLS_HANDSHAKE, TransportConfig, accept_loop, first_byte, keepalive};

/// Admitted gRPC connections waiting for tonic to take them.
const GRPC_BACKLOG: usize = 64;

/// The gRPC door's admitted connections, for tonic's `serve_with_incoming_shutdown`,
/// and the task that accepts them (owned by the lifecycle's tracker), which stops
/// accepting when its shutdown is cancelled (the stream then ends).
pub fn grpc_incoming(
    listener: TcpListener,
    cap: usize,
    config: TransportConfig,
    tls: bool,
    lifecycle: &Lifecycle,
) -> (
    impl futures::Stream<Item = Result<Admitted, std::io::Error>> + Send + 'static,
    tokio::task::JoinHandle<()>,
) {
    let Lifecycle { shutdown, tasks } = lifecycle;
    let (sender, receiver) = mpsc::channel(GRPC_BACKLOG);
    let task = tasks.spawn(accept_loop(
        listener,
        Gate::new("agent service (gRPC)", cap),
        shutdown.clone(),
        move |stream, peer, permit| {
            let sender = sender.clone();
            let timeout = config.header_read_timeout;
            async move {
                match first_byte(&stream, timeout).await {
                    None => {
                        tracing::debug!(%peer, "closed an agent connection that said nothing");
                        return;
                    }
                    Some(first) if tls && first != TLS_HANDSHAKE => {
                        tracing::debug!(%peer, "plaintext on the TLS agent port; closed (the agent should join with https://)");
                        return;
                    }
                    Some(_) => {}
                }
                keepalive(&stream);
                let admitted = Admitted {
                    stream,
                    _permit: permit,
                };
                // The server is stopping when tonic no longer takes connections.
                let _ = tokio::time::timeout(timeout, sender.send(Ok(admitted))).await;
            }
        },
    ));
    let incoming = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    (incoming, task)
}

/// A connection admitted to the gRPC door: it holds its place under the cap until
/// tonic drops it.
pub struct Admitted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Admitted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
