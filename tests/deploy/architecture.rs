//! docs/architecture.md: the import rules it marks "checked", read off the
//! source (comments skipped), so the document cannot drift from the code.

use std::path::{Path, PathBuf};

fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(path) = todo.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read a source dir") {
                todo.push(entry.expect("a dir entry").path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            // PostgreSQL's own connections are the store's, not a broker's.
            let code = code.join("\n").replace("PgConnection::connect", "");
            out.push((path, code));
        }
    }
    out
}

/// Files of `dirs` whose code mentions any of `needles`.
fn offenders(dirs: &[&str], needles: &[&str]) -> Vec<String> {
    dirs.iter()
        .flat_map(|d| sources(d))
        .filter(|(_, code)| needles.iter().any(|n| code.contains(n)))
        .map(|(path, _)| path.display().to_string())
        .collect()
}

#[test]
fn the_engine_the_store_and_handlers_use_no_broker_crate() {
    let found = offenders(&["engine", "store", "handler"], &["rdkafka", "lapin"]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn sql_for_the_key_table_is_written_in_the_store_only() {
    let needles = ["sqlx::query", "query_scalar(", "query_as("];
    let found = offenders(&["engine", "transport", "broker", "handler"], &needles);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn the_engine_imports_no_transport_and_telemetry_no_engine() {
    let engine = offenders(&["engine"], &["crate::transport", "crate::broker"]);
    assert!(engine.is_empty(), "{engine:?}");
    let telemetry = offenders(&["telemetry"], &["crate::engine"]);
    assert!(telemetry.is_empty(), "{telemetry:?}");
}

#[test]
fn broker_clients_are_built_in_the_broker_layer_only() {
    let dirs = ["transport", "cli", "engine", "store", "handler", "config"];
    let found = offenders(
        &dirs,
        &[
            "ClientConfig::new",
            "Connection::connect",
            "DefaultConnectionBuilder",
        ],
    );
    assert!(found.is_empty(), "{found:?}");
}
