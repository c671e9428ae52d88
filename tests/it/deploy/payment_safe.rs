//! Settings that would lose or skip payments, or panic later, stop
//! `dedupq config` and `dedupq run` at load, naming the setting; the same
//! file with the value fixed starts.

use crate::support::cli;

/// A configuration that consumes a Kafka topic and calls a provider.
const GOOD: &str = r#"
[kafka]
topics = ["payments"]

[handler]
url = "http://127.0.0.1:9/charges"

[retention]
redelivery_horizon = "1h"
"#;

fn config(text: &str) -> std::path::PathBuf {
    cli::config_file(&text.parse().expect("valid TOML"))
}

/// `dedupq <command>` on `text`: the exit code and stderr.
fn refused(text: &str, command: &str) -> (i32, String) {
    let ran = cli::run(&config(text), &[command], &[]);
    (ran.code, ran.stderr)
}

#[test]
fn the_good_configuration_loads() {
    let ran = cli::run(&config(GOOD), &["config"], &[]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("payments"), "{}", ran.stdout);
}

#[test]
fn a_transport_without_a_handler_url_does_not_start() {
    let without = GOOD.replace("url = \"http://127.0.0.1:9/charges\"", "");
    for command in ["config", "run"] {
        let (code, stderr) = refused(&without, command);
        assert_eq!(code, 2, "dedupq {command}: {stderr}");
        assert!(
            stderr.contains("handler.url") && stderr.contains("nowhere to go"),
            "dedupq {command}: {stderr}"
        );
    }
}

#[test]
fn each_unsafe_or_unusable_value_is_refused_at_load_naming_its_setting() {
    let cases = [
        (
            "[retention]",
            "[retention]\npurge_every = \"0s\"",
            "retention.purge_every",
        ),
        (
            "[kafka]",
            "[kafka]\ncommit_interval = \"0s\"",
            "kafka.commit_interval",
        ),
        ("[kafka]", "[kafka]\nbatch_size = 0", "kafka.batch_size"),
        (
            "[kafka]",
            "[kafka]\nauto_offset_reset = \"latest\"",
            "kafka.auto_offset_reset",
        ),
        (
            "[kafka]",
            "[kafka.client]\n\"isolation.level\" = \"read_uncommitted\"\n[kafka]",
            "kafka.client.isolation.level",
        ),
        (
            "[kafka]",
            "[kafka.client]\n\"enable.auto.commit\" = \"true\"\n[kafka]",
            "kafka.client.enable.auto.commit",
        ),
        (
            "[retention]",
            "[log]\nfilter = \"dedupq=loud\"\n[retention]",
            "log.filter",
        ),
        (
            "[retention]",
            "[identity.fingerprint]\nversion = 2\nexclud = [\"/sent_at\"]\n[retention]",
            "exclud",
        ),
    ];
    for (anchor, replacement, named) in cases {
        let text = GOOD.replacen(anchor, replacement, 1);
        let (code, stderr) = refused(&text, "config");
        assert_eq!(code, 2, "{named}: {stderr}");
        assert!(stderr.contains(named), "{named} not named: {stderr}");
    }
}
