//! A NAT, load balancer or firewall between dedupq and PostgreSQL forgets
//! a flow that sat idle, and tells neither end. A statement sent over such
//! a connection is never answered: without a client-side keepalive (the
//! PostgreSQL driver has none) it waits for the kernel's retransmission
//! timeout, about 15 minutes, holding its batch, its partition or its
//! HTTP request. A pooled connection idle past `store.idle_timeout` is
//! closed instead of used, so the claim after an idle spell opens a flow
//! of its own and is answered at once. A flow lost under a statement
//! (a server gone without a reset) is cut off at `store.statement_deadline`.
//!
//! The middlebox here is a TCP relay between dedupq and PostgreSQL that,
//! when told, stops relaying every flow it holds: the bytes dedupq sends
//! are taken and dropped, nothing comes back, and the sockets stay open.
//! New flows are relayed as before.

use crate::support::{self, isolated_store};
use dedupq::config::{IdentitySettings, SecretUrl, StoreSettings};
use dedupq::engine::Parser;
use dedupq::store::{ClaimResult, Store, StoreError};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// The relay: each flow with the flag that, once set, stops it for good.
struct Middlebox {
    addr: SocketAddr,
    flows: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    opened: Arc<AtomicUsize>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Middlebox {
    async fn to(server: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let flows: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let opened = Arc::new(AtomicUsize::new(0));
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let (flows, opened, tasks) = (flows.clone(), opened.clone(), tasks.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(upstream) = TcpStream::connect(server).await else {
                        continue;
                    };
                    opened.fetch_add(1, Ordering::SeqCst);
                    let forgotten = Arc::new(AtomicBool::new(false));
                    flows.lock().unwrap().push(forgotten.clone());
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = upstream.into_split();
                    let up = tokio::spawn(relay(from_client, to_server, forgotten.clone()));
                    let down = tokio::spawn(relay(from_server, to_client, forgotten));
                    tasks
                        .lock()
                        .unwrap()
                        .extend([up.abort_handle(), down.abort_handle()]);
                }
            })
        };
        tasks.lock().unwrap().push(accept.abort_handle());
        Self {
            addr,
            flows,
            opened,
            tasks,
        }
    }

    /// Every flow open now is forgotten: nothing more crosses it.
    fn forget_open_flows(&self) {
        for flow in self.flows.lock().unwrap().iter() {
            flow.store(true, Ordering::SeqCst);
        }
    }

    fn flows_opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }
}

impl Drop for Middlebox {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// Copies one direction of a flow until it ends or is forgotten; a
/// forgotten flow takes what arrives and holds its sockets open.
async fn relay(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, forgotten: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if forgotten.load(Ordering::SeqCst) {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _held = (from, to);
    std::future::pending::<()>().await
}

async fn try_claim(store: &Store, key: &str) -> Result<ClaimResult, StoreError> {
    let msg = support::message("acme", key, r#"{"amount": 5}"#);
    let parsed = Parser::new(&IdentitySettings::default())
        .parse(&msg)
        .expect("parses");
    let request = support::claim_request(&parsed, &msg);
    let mut results = store
        .claim_batch(&[request], "worker", Duration::from_secs(30))
        .await?;
    Ok(results.pop().expect("one result"))
}

/// A claim, retried after an error that says PostgreSQL was busy (a new
/// connection refused or slow to open on a loaded machine), as the engine
/// retries it. An error never comes over a forgotten flow: nothing does.
async fn claim(store: &Store, key: &str) -> ClaimResult {
    loop {
        match try_claim(store, key).await {
            Ok(result) => return result,
            Err(e) if e.is_transient() => {
                eprintln!("claim {key}: retrying after {e:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("claim {key}: {e:?}"),
        }
    }
}

/// A store of its own schema whose connections cross a middlebox, with
/// `edit` applied to its settings.
async fn through_a_middlebox(edit: impl FnOnce(&mut StoreSettings)) -> (Middlebox, Store) {
    let (_, mut settings) = isolated_store().await;
    let mut url = reqwest::Url::parse(settings.url.expose()).expect("a URL");
    let server: SocketAddr = format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port().unwrap_or(5432)
    )
    .parse()
    .expect("PostgreSQL at an IP address");
    let middlebox = Middlebox::to(server).await;
    url.set_port(Some(middlebox.addr.port())).expect("a port");
    settings.url = SecretUrl::new(url.to_string());
    edit(&mut settings);
    settings.validate().expect("valid settings");
    let store = Store::connect_lazy(&settings).expect("store");
    (middlebox, store)
}

/// A claim over one pooled connection, whose flow is then forgotten once
/// the connection is idle in the pool again. Returns how many flows the
/// middlebox had opened.
async fn pooled_then_forgotten(store: &Store, middlebox: &Middlebox) -> usize {
    assert!(matches!(claim(store, "before").await, ClaimResult::Won(_)));
    // The pool checks a connection as it takes it back (a round trip):
    // forgotten before that, the check would hang and the pool would
    // never see the connection again.
    support::eventually(
        Duration::from_secs(10),
        "the connection back in the pool",
        || async { (store.pool().num_idle() == 1).then_some(()) },
    )
    .await;
    let flows = middlebox.flows_opened();
    middlebox.forget_open_flows();
    flows
}

#[tokio::test]
async fn a_connection_whose_flow_was_forgotten_while_idle_is_never_used_again() {
    let (middlebox, store) = through_a_middlebox(|s| {
        s.idle_timeout = Duration::from_millis(500);
        // A new connection (TCP, authentication, the session's SETs) may
        // take seconds on a loaded machine; a claim sent over the
        // forgotten flow would wait for the statement deadline.
        s.acquire_timeout = Duration::from_secs(20);
        s.statement_deadline = Duration::from_secs(120);
    })
    .await;
    let flows = pooled_then_forgotten(&store, &middlebox).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let after = tokio::time::timeout(Duration::from_secs(60), claim(&store, "after"))
        .await
        .expect("the claim after the idle spell must not wait on a forgotten flow");
    assert!(matches!(after, ClaimResult::Won(_)), "{after:?}");
    assert!(
        middlebox.flows_opened() > flows,
        "the claim went over a flow of its own"
    );
}

/// sqlx's own reaper takes every idle connection it does not close and
/// puts it back as if just used, so the idle time `store.idle_timeout` is
/// checked against never passes the reaper's period: with it running, the
/// test above used the forgotten flow in about half its runs, as the
/// reaper's timer fell. dedupq's pool has none.
#[tokio::test]
async fn the_pool_runs_no_reaper_that_would_make_idle_connections_look_fresh() {
    let (store, _) = isolated_store().await;
    let options = store.pool().options();
    assert_eq!(options.get_idle_timeout(), None, "no idle reaper");
    assert_eq!(options.get_max_lifetime(), None, "no lifetime reaper");
}

/// A flow lost under a statement (a server gone without a reset, a cut
/// path): no answer ever comes. Past `store.statement_deadline` the
/// statement fails like a broken connection, its connection is dropped,
/// and the next one runs over a flow of its own.
#[tokio::test]
async fn a_statement_whose_flow_is_lost_fails_at_the_deadline_and_the_next_one_is_answered() {
    let (middlebox, store) = through_a_middlebox(|s| {
        s.idle_timeout = Duration::from_secs(600);
        s.lock_timeout = Duration::from_millis(200);
        s.statement_deadline = Duration::from_secs(1);
    })
    .await;
    let flows = pooled_then_forgotten(&store, &middlebox).await;
    let lost = tokio::time::timeout(Duration::from_secs(10), try_claim(&store, "lost"))
        .await
        .expect("a statement over a lost flow must not wait past its deadline");
    let e = lost.expect_err("no answer came");
    assert!(e.is_transient(), "retried like an outage: {e}");
    assert!(
        format!("{:?}", e).contains("store.statement_deadline"),
        "names the setting: {e:?}"
    );
    let next = tokio::time::timeout(Duration::from_secs(10), claim(&store, "next"))
        .await
        .expect("the next statement is answered");
    assert!(matches!(next, ClaimResult::Won(_)), "{next:?}");
    assert!(middlebox.flows_opened() > flows);
}
