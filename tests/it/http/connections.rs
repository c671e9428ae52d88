//! `api.max_connections`: open client connections are bounded; past the
//! bound a new connection waits (in the listen backlog) until one closes,
//! so idle keep-alive clients cannot exhaust the process's descriptors.

use super::harness::App;
use crate::support::process::Provider;
use dedupq_provider::Knobs;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends a request for a route that does not exist on `stream` and reads
/// the status line, within `limit`; None if no answer came.
async fn status_line(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    let request = "POST /v1/nowhere HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(limit, stream.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().map(str::to_string)
}

/// `n` connections to `addr`, each answered once (the bound not reached).
async fn served(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let line = status_line(&mut s, Duration::from_secs(10)).await;
        assert!(
            line.is_some_and(|l| l.contains("404")),
            "served within the bound"
        );
        held.push(s);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_past_api_max_connections_waits_until_one_closes() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |s, _| s.api.max_connections = 2).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let mut held = served(&addr, 2).await;
    let mut third = TcpStream::connect(&addr)
        .await
        .expect("queued by the kernel");
    assert_eq!(
        status_line(&mut third, Duration::from_millis(1500)).await,
        None,
        "not served while two connections are open"
    );
    drop(held.pop());
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
        .await
        .expect("served once a connection closed")
        .expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("404"));
}

/// A client that sends one request and then keeps its connection open
/// without a word holds a slot only for `api.header_timeout`: the wait for
/// the next request's headers is bounded like the first, so idle keep-alive
/// connections cannot hold every slot of `api.max_connections` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_keep_alive_connections_are_closed_after_api_header_timeout() {
    let provider = Provider::start(Knobs::default()).await;
    let app = App::with(&provider, |s, _| {
        s.api.max_connections = 2;
        s.api.header_timeout = Duration::from_secs(1);
    })
    .await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let held = served(&addr, 2).await;
    // Both slots are held by connections that said nothing since their
    // answer; the server closes them, and the next client is served.
    let mut third = TcpStream::connect(&addr)
        .await
        .expect("queued by the kernel");
    let line = status_line(&mut third, Duration::from_secs(20)).await;
    assert!(
        line.as_deref().is_some_and(|l| l.contains("404")),
        "served once the idle connections timed out: {line:?}"
    );
    for mut s in held {
        // What is left to read is the rest of its one answer, then the end.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
            .await
            .expect("the idle connection was closed")
            .expect("read");
        assert!(
            !String::from_utf8_lossy(&rest).contains("HTTP/1.1"),
            "the idle connection got no second answer"
        );
    }
}
