//! The documented commands (README.md and docs/), the configuration
//! reference (docs/configuration.md) and the metrics (docs/metrics.md) are
//! checked against the code, so they cannot drift.

use clap::Parser;
use dedupq::cli::Cli;
use dedupq::config::Settings;
use dedupq::metrics::Metrics;
use std::collections::BTreeSet;

fn page(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn readme() -> String {
    page("README.md")
}

/// README.md and every page under docs/, one after the other.
fn all_pages() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages.iter().fold(readme(), |mut all, p| {
        all.push_str(&std::fs::read_to_string(p).expect("a docs page"));
        all
    })
}

use crate::support::fenced_blocks as blocks;

fn leaf_paths(value: &toml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                leaf_paths(v, &format!("{prefix}{k}."), out);
            }
            if t.is_empty() {
                out.insert(prefix.trim_end_matches('.').to_string());
            }
        }
        _ => {
            out.insert(prefix.trim_end_matches('.').to_string());
        }
    }
}

#[test]
fn the_configuration_reference_lists_every_setting_with_its_default() {
    let text = page("docs/configuration.md");
    let reference = blocks(&text, "toml")
        .into_iter()
        .find(|b| b.contains("[store]") && b.contains("[log]"))
        .expect("a full configuration block in docs/configuration.md");
    let raw: toml::Value = toml::from_str(&reference).expect("the reference is valid TOML");
    let parsed: Settings =
        toml::from_str(&reference).expect("the reference parses as Settings (no unknown keys)");
    parsed
        .validate()
        .expect("the reference is a valid configuration");

    let defaults = toml::Value::try_from(Settings::default()).unwrap();
    assert_eq!(
        toml::Value::try_from(&parsed).unwrap(),
        defaults,
        "every value in the reference is the default"
    );
    let (mut documented, mut actual) = (BTreeSet::new(), BTreeSet::new());
    leaf_paths(&raw, "", &mut documented);
    leaf_paths(&defaults, "", &mut actual);
    let missing: Vec<_> = actual.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "settings missing from docs/configuration.md: {missing:?}"
    );
}

#[test]
fn every_documented_metric_exists_and_every_metric_is_documented() {
    let text = page("docs/metrics.md");
    let documented: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `dedupq_"))
        .map(|rest| format!("dedupq_{}", rest.split('`').next().unwrap()))
        .collect();
    let exported: BTreeSet<String> = Metrics::new().names.iter().cloned().collect();
    assert_eq!(documented, exported);
}

#[test]
fn the_documented_commands_exist_and_parse() {
    let text = readme();
    for script in ["scripts/demo", "scripts/test", "scripts/services"] {
        assert!(text.contains(script), "README mentions {script}");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect(script).permissions(),
        );
        assert!(mode & 0o111 != 0, "{script} is executable");
    }
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
    assert!(
        ci.contains("./scripts/test"),
        "CI runs the README's test command"
    );

    let text = all_pages();
    let commands: Vec<String> = blocks(&text, "sh")
        .iter()
        .flat_map(|b| b.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l.starts_with("dedupq "))
        .collect();
    assert!(commands.len() >= 5);
    for line in commands {
        let command = line.split('#').next().unwrap();
        let mut words = Vec::new();
        let mut quoted = command.split('"');
        while let Some(plain) = quoted.next() {
            words.extend(plain.split_whitespace().map(str::to_string));
            if let Some(q) = quoted.next() {
                words.push(q.to_string());
            }
        }
        Cli::try_parse_from(&words)
            .unwrap_or_else(|e| panic!("documented command `{line}` does not parse: {e}"));
    }
}
