//! TLS to an orchestrator whose certificate is pinned by its fingerprint
//! (`--server-fingerprint`): a connector for tonic that opens TCP, then a rustls
//! session that trusts that one certificate and speaks HTTP/2 (ALPN `h2`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use skein_proto::tls::Fingerprint;
use tokio::net::TcpStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;

/// The connector: clone it into each connection attempt.
#[derive(Clone)]
pub(crate) struct PinnedTls {
    connector: tokio_rustls::TlsConnector,
}

impl PinnedTls {
    /// A connector that trusts only the certificate of `pin`.
    pub(crate) fn new(pin: Fingerprint) -> Result<PinnedTls, rustls::Error> {
        let config = skein_proto::tls::pinned_client_config(pin, &[b"h2"])?;
        Ok(PinnedTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }
}

type Connecting =
    Pin<Box<dyn Future<Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send>>;

impl Service<Uri> for PinnedTls {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let connector = self.connector.clone();
        Box::pin(async move {
            let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned());
            let host = uri.host().ok_or_else(|| invalid("the join address has no host"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().ok_or_else(|| invalid("the join address has no port"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            // The name only goes into the handshake (SNI); the pin decides trust.
            let name = ServerName::try_from(host).map_err(|_| invalid("the join address's host is not a name"))?;
            let tls = connector.connect(name, tcp).await?;
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(std::io::Error::other(
                    "the server did not agree to HTTP/2 over TLS; is this the agent port (--agent-listen)?",
                ));
            }
            Ok(TokioIo::new(tls))
        })
    }
}
