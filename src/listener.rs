//! dedupq's HTTP/1.1 listeners (the API's and the operator endpoints'):
//! served by hyper with the header limits and the header-read timeout set
//! on the connection itself, a bound on open connections, and a bounded
//! graceful shutdown (stop accepting, let in-flight requests finish).

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) struct Limits {
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub header_timeout: Duration,
    pub shutdown_timeout: Duration,
}

pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        // A client that trickles its headers holds a connection for at
        // most this long (slowloris).
        .header_read_timeout(limits.header_timeout)
        // Larger headers are answered 431 by hyper, before any of our code.
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers);
    let graceful = GracefulShutdown::new();
    // One permit per open connection: at the limit, the next is accepted
    // only once one closes (until then it waits in the listen backlog).
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "accepting an API connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        // Answers are small and awaited by the client: send them at once.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "API connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    let deadline = Instant::now() + limits.shutdown_timeout;
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("API requests still open after api.shutdown_timeout; closing them");
    }
    tasks.close();
    if tokio::time::timeout_at(deadline, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            running = tasks.len(),
            "handlers still running after api.shutdown_timeout; their keys are taken over after the lease"
        );
    }
}
