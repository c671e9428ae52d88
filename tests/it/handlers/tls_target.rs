//! An HTTPS webhook target for the forwarder tests: certificates made with
//! `openssl` in a directory of the test's own, a rustls server that
//! requires a client certificate signed by its CA, and a record of every
//! request that reached it.

use crate::support::unique;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::IntoResponse;
use axum::Router;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// A CA, a server certificate for 127.0.0.1 and a client certificate,
/// both signed by the CA.
pub struct Certs {
    dir: PathBuf,
    pub ca: PathBuf,
    /// The client's certificate and private key in one PEM file.
    pub client_identity: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// A key and certificate `name` signed by the CA, with `extensions`.
fn signed(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), extensions).expect("write extensions");
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let mut req = vec![
        "req", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
    ];
    req.extend(EC);
    openssl(dir, &req);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-sha256",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

impl Certs {
    pub fn make() -> Self {
        let dir = std::env::temp_dir().join(unique("dedupq-tls"));
        std::fs::create_dir_all(&dir).expect("create cert dir");
        let mut ca = vec![
            "req",
            "-x509",
            "-nodes",
            "-sha256",
            "-days",
            "2",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=webhook target test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ];
        ca.extend(EC);
        openssl(&dir, &ca);
        signed(
            &dir,
            "server",
            "/CN=localhost",
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        );
        signed(
            &dir,
            "client",
            "/CN=dedupq",
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=clientAuth\n",
        );
        let identity = [
            std::fs::read(dir.join("client.pem")).unwrap(),
            std::fs::read(dir.join("client.key")).unwrap(),
        ]
        .concat();
        let client_identity = dir.join("client-identity.pem");
        std::fs::write(&client_identity, identity).expect("write client identity");
        Self {
            ca: dir.join("ca.pem"),
            client_identity,
            dir,
        }
    }

    fn server_config(&self) -> ServerConfig {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&self.ca).expect("read CA") {
            roots.add(ca.expect("a CA certificate")).expect("add CA");
        }
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .expect("client verifier");
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(self.dir.join("server.pem"))
                .expect("read server certificate")
                .map(|c| c.expect("a certificate"))
                .collect();
        let key = PrivateKeyDer::from_pem_file(self.dir.join("server.key")).expect("server key");
        ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config")
    }
}

/// One request as the target received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// Every value of a header (names compared case-insensitively).
    pub fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

type Log = Arc<Mutex<Vec<Received>>>;

pub struct Target {
    /// `https://127.0.0.1:<port>`
    pub base: String,
    log: Log,
    stop: CancellationToken,
    /// The certificates new connections are served with.
    acceptor: Arc<Mutex<TlsAcceptor>>,
}

async fn record(
    State(log): State<Log>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let headers = headers
        .iter()
        .map(|(n, v)| {
            let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (n.as_str().to_string(), value)
        })
        .collect();
    let mut log = log.lock().unwrap();
    log.push(Received {
        path: uri.path().to_string(),
        headers,
        body: body.to_vec(),
    });
    let id = format!("t_{}", log.len());
    (
        axum::http::StatusCode::CREATED,
        axum::Json(serde_json::json!({ "id": id })),
    )
}

impl Target {
    pub async fn start(certs: &Certs) -> Self {
        Self::serve(certs, true).await
    }

    /// A target that closes every connection after its answer, so each
    /// request makes a new TLS handshake (and meets the certificates of
    /// the last `rotate`).
    pub async fn start_closing(certs: &Certs) -> Self {
        Self::serve(certs, false).await
    }

    /// New connections are served with `certs` (its server certificate,
    /// and only client certificates of its CA), as a provider that moved
    /// to a new CA.
    pub fn rotate(&self, certs: &Certs) {
        *self.acceptor.lock().unwrap() = TlsAcceptor::from(Arc::new(certs.server_config()));
    }

    async fn serve(certs: &Certs, keep_alive: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind target");
        let base = format!("https://{}", listener.local_addr().unwrap());
        let acceptor = Arc::new(Mutex::new(TlsAcceptor::from(Arc::new(
            certs.server_config(),
        ))));
        let current = acceptor.clone();
        let log = Log::default();
        let app = Router::new().fallback(record).with_state(log.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let tcp = tokio::select! {
                    _ = stopped.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((tcp, _)) => tcp,
                        Err(_) => continue,
                    },
                };
                let (acceptor, app) = (current.lock().unwrap().clone(), app.clone());
                tokio::spawn(async move {
                    // A client without a certificate of the CA ends here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            base,
            log,
            stop,
            acceptor,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
