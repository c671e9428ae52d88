//! The files the configuration names: TLS certificates and keys, the API
//! keys file and webhook secrets, librdkafka's `*.location` files. Each
//! must be readable by this user; a certificate must be PEM.

use super::{Check, Report};
use crate::config::Settings;
use std::path::{Path, PathBuf};

/// What a file is expected to hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// A PEM certificate, key or bundle.
    Pem,
    /// Anything readable (a secret, a keys file).
    Text,
}

pub(super) fn check(s: &Settings, report: &mut Report) {
    for (setting, path, holds) in named_files(s) {
        report.push(check_file(&setting, &path, holds));
    }
}

fn named_files(s: &Settings) -> Vec<(String, PathBuf, Holds)> {
    let mut files = Vec::new();
    let mut add = |setting: String, path: &Option<PathBuf>, holds| {
        if let Some(p) = path {
            files.push((setting, p.clone(), holds));
        }
    };
    add("handler.ca_file".into(), &s.handler.ca_file, Holds::Pem);
    add(
        "handler.client_identity_file".into(),
        &s.handler.client_identity_file,
        Holds::Pem,
    );
    if !s.amqp.queues.is_empty() {
        add("amqp.tls_ca_file".into(), &s.amqp.tls_ca_file, Holds::Pem);
    }
    if s.telemetry.enabled {
        add("telemetry.ca_file".into(), &s.telemetry.ca_file, Holds::Pem);
    }
    if s.api.enabled {
        add("api.keys_file".into(), &s.api.keys_file, Holds::Text);
        for r in &s.api.routes {
            let setting = format!("api.routes.{}.secret_file", r.name);
            add(setting, &r.secret_file, Holds::Text);
        }
    }
    if !s.kafka.topics.is_empty() {
        for (property, value) in &s.kafka.client {
            if property.ends_with(".location") {
                let setting = format!("kafka.client.\"{property}\"");
                add(setting, &Some(PathBuf::from(value)), Holds::Pem);
            }
        }
        for (property, path) in &s.kafka.client_files {
            let setting = format!("kafka.client_files.\"{property}\"");
            add(setting, &Some(path.clone()), Holds::Text);
        }
    }
    files
}

fn check_file(setting: &str, path: &Path, holds: Holds) -> Check {
    let name = format!("file {setting}");
    match std::fs::read(path) {
        Err(e) => Check::fail(
            name,
            format!("{} cannot be read: {e}", path.display()),
            "mount the file there, readable by the user dedupq runs as, or correct the path",
        ),
        Ok(bytes) if holds == Holds::Pem && !contains(&bytes, b"-----BEGIN ") => Check::fail(
            name,
            format!("{} is not PEM (no -----BEGIN line)", path.display()),
            "give the PEM text of the certificate or key (openssl x509 -in cert.der -inform der \
             -out cert.pem converts DER)",
        ),
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Check::fail(
            name,
            format!("{} is empty", path.display()),
            "write the value into the file",
        ),
        Ok(bytes) => Check::ok(
            name,
            format!("{} readable ({} bytes)", path.display(), bytes.len()),
        ),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
