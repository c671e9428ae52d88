//! A service "appears" on a port where nothing listened: a TCP forwarder
//! to the shared server, which the test does not touch.

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards every connection to `port` on 127.0.0.1 to `target`, until the
/// handle is aborted.
pub async fn forward(port: u16, target: String) -> JoinHandle<()> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the forwarded port");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(target.as_str()).await {
                    let _ = copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    })
}

/// A forwarder whose target can be moved, as a virtual IP or a DNS name
/// moves to the new primary in a failover: connections made after
/// [`Moving::point_at`] go to the new target, the ones already made stay
/// with the old one (and end with it).
pub struct Moving {
    target: std::sync::Arc<std::sync::Mutex<String>>,
    task: JoinHandle<()>,
}

impl Moving {
    /// Forwards `port` on 127.0.0.1 to `target`.
    pub async fn start(port: u16, target: String) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the forwarded port");
        let target = std::sync::Arc::new(std::sync::Mutex::new(target));
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
        Self { target, task }
    }

    /// New connections go to `target` from now on.
    pub fn point_at(&self, target: String) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        self.task.abort();
    }
}
