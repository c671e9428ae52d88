//! docs/architecture.md: the import rules it marks "checked", read off the
//! source (comments and unit tests skipped), so the document cannot drift
//! from the code.

use std::path::{Path, PathBuf};

fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    sources_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir))
}

/// The code (comments skipped) of every `.rs` file under `root`.
fn sources_under(root: &Path) -> Vec<(PathBuf, String)> {
    let root = root.to_path_buf();
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(path) = todo.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read a source dir") {
                todo.push(entry.expect("a dir entry").path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let mut code: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            // A file's unit tests (`#[cfg(test)] mod tests`, at its end)
            // are not the product: a listener's test may connect to it.
            if let Some(at) = code.windows(2).position(|w| {
                w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests")
            }) {
                code.truncate(at);
            }
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
    // Every file of the product outside src/broker, and the lab's.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let broker = repo.join("src").join("broker");
    let files = sources_under(&repo.join("src"))
        .into_iter()
        .filter(|(path, _)| !path.starts_with(&broker))
        .chain(sources_under(&repo.join("lab").join("src")));
    let needles = [
        "ClientConfig::new",
        "Connection::connect",
        "DefaultConnectionBuilder",
        "TcpStream::connect",
    ];
    let found: Vec<String> = files
        .filter(|(_, code)| needles.iter().any(|n| code.contains(n)))
        .map(|(path, _)| path.display().to_string())
        .collect();
    // The bench waits for its own HTTP server's port, which is no broker.
    let found: Vec<&String> = found
        .iter()
        .filter(|path| !path.ends_with("lab/src/bench/http.rs"))
        .collect();
    assert!(found.is_empty(), "{found:?}");
    let kafka = offenders(&["broker/kafka"], &["ClientConfig::new"]);
    let amqp = offenders(&["broker/amqp"], &["DefaultConnectionBuilder"]);
    assert_eq!((kafka.len(), amqp.len()), (1, 1), "{kafka:?} {amqp:?}");
}

#[test]
fn the_product_crate_has_no_lab_module_and_depends_on_neither_lab_nor_simulator() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for module in ["bench", "scenario", "provider", "lab"] {
        assert!(!repo.join("src").join(module).exists(), "src/{module}");
        assert!(!repo.join("src").join(format!("{module}.rs")).exists());
    }
    let lib = std::fs::read_to_string(repo.join("src/lib.rs")).expect("src/lib.rs");
    for module in ["bench", "scenario", "provider"] {
        assert!(!lib.contains(&format!("mod {module};")), "lib.rs: {module}");
    }
    let manifest: toml::Table = std::fs::read_to_string(repo.join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml is TOML");
    let dependencies = manifest["dependencies"].as_table().expect("[dependencies]");
    for crate_name in ["dedupq-lab", "dedupq-provider"] {
        assert!(!dependencies.contains_key(crate_name), "{crate_name}");
    }
}
