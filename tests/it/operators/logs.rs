//! Log lines name the cause of an error, and carry colour codes only when
//! written to a terminal.

use crate::support::{self, cli, eventually, process};
use dedupq_provider::Knobs;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `command` until its output holds `needle`; returns the output.
async fn output_until(mut command: Command, needle: &str, config: &std::path::Path) -> String {
    let log = std::env::temp_dir().join(support::unique("dedupq-log"));
    let file = std::fs::File::create(&log).unwrap();
    // A group of its own: `script` runs dedupq as its child, and killing
    // `script` alone would leave that dedupq running after the test.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("spawn");
    let text = eventually(Duration::from_secs(30), needle, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains(needle).then_some(text)
    })
    .await;
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
    // `script` starts its child in a session of its own: find it by the
    // configuration file only this test uses.
    let _ = Command::new("pkill")
        .args(["-KILL", "-f"])
        .arg(config)
        .status();
    text
}

#[tokio::test]
async fn a_failed_purge_is_logged_with_its_cause() {
    let (store, settings) = support::isolated_store().await;
    let provider = process::Provider::start(Knobs::default()).await;
    let mut config = process::base_config(&settings, &provider);
    config.insert(
        "retention".into(),
        toml::Value::Table(
            "keep = \"2h\"\nredelivery_horizon = \"1h\"\npurge_every = \"300ms\""
                .parse()
                .unwrap(),
        ),
    );
    let p = process::Dedupq::start(&config).await;
    eventually(Duration::from_secs(30), "an upkeep leader", || async {
        (p.metric("dedupq_upkeep_leader").await == 1.0).then_some(())
    })
    .await;
    sqlx::query("DROP TABLE dedupq_keys")
        .execute(store.pool())
        .await
        .unwrap();
    let line = eventually(
        Duration::from_secs(30),
        "the purge failure logged",
        || async {
            p.log_tail()
                .lines()
                .find(|l| l.contains("retention purge failed"))
                .map(str::to_string)
        },
    )
    .await;
    assert!(
        line.contains("PostgreSQL cannot take the statement now (SQLSTATE 42P01): ")
            && line.contains("\"dedupq_keys\" does not exist"),
        "the outer error and PostgreSQL's reason: {line}"
    );
    assert_eq!(
        p.metric("dedupq_ready").await,
        1.0,
        "the store itself is up"
    );
}

#[tokio::test]
async fn logs_are_coloured_on_a_terminal_and_plain_in_a_file() {
    let (_, settings) = support::isolated_store().await;
    let text = format!(
        "[store]\nurl = \"{}\"\nschema = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
        settings.url.expose(),
        settings.schema.as_deref().unwrap()
    );
    let config = cli::config_file(&text.parse().unwrap());
    let bin = env!("CARGO_BIN_EXE_dedupq");

    let mut plain = Command::new(bin);
    plain.arg("--config").arg(&config).arg("run");
    let in_file = output_until(plain, "dedupq running", &config).await;
    assert!(
        !in_file.contains('\u{1b}'),
        "no escapes in a file: {in_file:?}"
    );

    // `script` gives the process a pseudo-terminal, as an operator's shell does.
    let mut tty = Command::new("script");
    let inner = format!("{bin} --config {} run", config.display());
    tty.args(["-qefc", &inner, "/dev/null"]);
    let on_terminal = output_until(tty, "dedupq", &config).await;
    assert!(
        on_terminal.contains("\u{1b}["),
        "colour on a terminal: {on_terminal:?}"
    );
}
