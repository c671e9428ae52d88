//! The raw client's socket: plain TCP for `amqp://`, TLS for `amqps://`
//! trusting the system's roots and `amqp.tls_ca_file`, as lapin does.

use super::RawAmqpError;
use crate::config::{AmqpSettings, ConfigError};
use lapin::uri::{AMQPScheme, AMQPUri};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// TCP connect, and the TLS handshake for `amqps://`.
    pub(super) async fn open(uri: &AMQPUri, settings: &AmqpSettings) -> Result<Self, RawAmqpError> {
        let host = uri.authority.host.as_str();
        let tcp = TcpStream::connect((host, uri.authority.port)).await?;
        tcp.set_nodelay(true)?;
        if uri.scheme == AMQPScheme::AMQP {
            return Ok(Stream::Plain(tcp));
        }
        let server = ServerName::try_from(host.to_string()).map_err(|_| {
            RawAmqpError::Config(ConfigError::new(
                "amqp.url",
                format!("'{host}' is not a host name TLS can verify"),
                "use the host name or IP address in the broker's certificate",
            ))
        })?;
        let connector = TlsConnector::from(Arc::new(tls_config(settings)?));
        Ok(Stream::Tls(Box::new(connector.connect(server, tcp).await?)))
    }
}

/// The system's roots and the CA of `amqp.tls_ca_file`, read at every
/// connect so a rotated file takes effect on the next one.
fn tls_config(settings: &AmqpSettings) -> Result<ClientConfig, RawAmqpError> {
    let mut roots = RootCertStore::empty();
    // Unreadable system certificates are skipped, as lapin skips them.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(pem) = settings.tls_ca_pem()? {
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                RawAmqpError::Config(ConfigError::new(
                    "amqp.tls_ca_file",
                    format!("holds a certificate that does not parse: {e}"),
                    "point it at the PEM file of the CA that signed the broker's certificate",
                ))
            })?;
        roots.add_parsable_certificates(certs);
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
