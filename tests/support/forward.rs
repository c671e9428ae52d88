//! A service "appears" on a port where nothing listened: a TCP forwarder
//! to the shared server, which the test does not touch. Its target can be
//! moved, as a virtual IP or a DNS name moves to the new primary in a
//! failover.

use std::sync::{Arc, Mutex};
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards connections until aborted or dropped.
pub struct Forwarder {
    target: Arc<Mutex<String>>,
    task: JoinHandle<()>,
}

/// Forwards every connection to `port` on 127.0.0.1 to `target`.
pub async fn forward(port: u16, target: String) -> Forwarder {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the forwarded port");
    let target = Arc::new(Mutex::new(target));
    let current = target.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let to = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(to.as_str()).await {
                    let _ = copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    Forwarder { target, task }
}

impl Forwarder {
    /// Connections made from now on go to `target`; the ones already made
    /// stay with the old one (and end with it).
    pub fn point_at(&self, target: String) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }

    /// Stops accepting: the port is closed again.
    pub fn abort(&self) {
        self.task.abort();
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
