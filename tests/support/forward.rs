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
