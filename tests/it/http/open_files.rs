//! The open-files limit (`RLIMIT_NOFILE`). Services often start with a
//! soft limit of 1024 (systemd, containerd) while the API alone may hold
//! `api.max_connections` (4096) client connections: before dedupq raised
//! its limit, idle clients could take every descriptor, and the next
//! payment was never accepted. `dedupq run` raises its soft limit to the
//! hard one, and refuses to start when the connections its configuration
//! allows do not fit under it.

use super::harness::{client, keys_file, scratch, wait_listening, Reply, ACME_KEY};
use crate::support::cli::config_file;
use crate::support::isolated_store;
use crate::support::process::{
    base_config, dedupq_command, free_port, limit_open_files, Dedupq, Provider,
};
use dedupq_provider::Knobs;
use std::net::SocketAddr;
use std::time::Duration;

fn api_config(
    provider: &Provider,
    store: &dedupq::config::StoreSettings,
    api: SocketAddr,
    extra: &str,
) -> toml::Table {
    let mut config = base_config(store, provider);
    let overrides: toml::Table = format!(
        r#"
[api]
enabled = true
listen = "{api}"
keys_file = "{keys}"
routes = [{{ name = "payments" }}]
{extra}
"#,
        keys = keys_file(&scratch()).display(),
    )
    .parse()
    .expect("config");
    config.extend(overrides);
    config
}

/// The soft and hard open-files limits of process `pid`.
fn open_files_of(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open-files line");
    let mut words = line["Max open files".len()..].split_whitespace();
    (
        words.next().unwrap_or_default().to_string(),
        words.next().unwrap_or_default().to_string(),
    )
}

/// This test process holds hundreds of sockets of its own: its soft limit
/// goes up to its hard limit too.
fn raise_own_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit touch only the struct they are given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_soft_limit_of_256_every_allowed_connection_is_served_and_payments_go_on() {
    raise_own_limit();
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    // 128 (operator listener) + 8 (store) + 256 (reserve) + 600 + 64 = 1056.
    let config = api_config(
        &provider,
        &store,
        api,
        "max_connections = 600\nmax_requests_in_flight = 64\nheader_timeout = \"5m\"",
    );
    let dedupq = Dedupq::start_with_open_files(&config, 256, 2048).await;
    wait_listening(api).await;
    let pid = dedupq.pid().expect("running");
    assert_eq!(
        open_files_of(pid),
        ("2048".to_string(), "2048".to_string()),
        "the soft limit was raised to the hard one"
    );

    // Silent clients take all but one of the API's connections: far more
    // than the 256 descriptors the process was started with.
    let mut idle = Vec::new();
    while idle.len() < 599 {
        idle.push(tokio::net::TcpStream::connect(api).await.expect("connect"));
    }
    let pay = client()
        .post(format!("http://{api}/v1/payments"))
        .bearer_auth(ACME_KEY)
        .header("Idempotency-Key", "pay-fd-1")
        .body(r#"{"amount": 100, "currency": "RUB"}"#)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the payment is accepted while the idle clients hold theirs");
    let reply = Reply::from(pay).await;
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(provider.stats().await.charges, 1, "charged once");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_cannot_fit_under_the_hard_limit_stop_start_up_naming_the_setting() {
    let provider = Provider::start(Knobs::default()).await;
    let (_store, store) = isolated_store().await;
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    // The defaults: 4096 client connections and 1024 requests in flight.
    let config = api_config(&provider, &store, api, "");
    let (code, log) =
        Dedupq::run_to_exit_with_open_files(&config, 1024, 1024, Duration::from_secs(60)).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("api.max_connections") && log.contains("may open 1024"),
        "{log}"
    );
    assert_eq!(provider.stats().await.charges, 0);

    // `dedupq check` under the same limit fails its line, with the fix.
    let (code, line) = check_open_files(&config, 1024);
    assert!(line.starts_with("fail"), "{line}");
    assert!(line.contains("lower api.max_connections"), "{line}");
    assert_eq!(code, Some(1), "{line}");

    // Within the limit, the same line is ok.
    let mut fits = config.clone();
    let api_section = fits["api"].as_table_mut().expect("api");
    api_section.insert("max_connections".into(), 300.into());
    api_section.insert("max_requests_in_flight".into(), 64.into());
    let (_, line) = check_open_files(&fits, 1024);
    assert!(line.starts_with("ok"), "{line}");
}

/// Runs `dedupq check` on `config` with an open-files limit of `limit`:
/// its exit code and its `process.open_files` line.
fn check_open_files(config: &toml::Table, limit: u64) -> (Option<i32>, String) {
    let file = config_file(config);
    let mut check = dedupq_command();
    check.arg("--config").arg(&file).arg("check");
    limit_open_files(&mut check, limit, limit);
    let out = check.output().expect("run dedupq check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("process.open_files"))
        .unwrap_or_else(|| panic!("no process.open_files line:\n{stdout}"))
        .to_string();
    (out.status.code(), line)
}
