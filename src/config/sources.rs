//! Secrets from files and from the environment, resolved once at load so
//! that the rest of dedupq only sees finished settings.
//!
//! Files: `store.url_file`, `amqp.url_file`, `handler.url_file`, and
//! `[kafka.client_files]` (librdkafka property -> file), for secrets mounted
//! by Kubernetes or Docker. A file's content is used as is, minus trailing
//! line breaks.
//!
//! Environment: librdkafka property names contain dots, which a variable
//! name cannot, so `DEDUPQ__KAFKA__CLIENT__<NAME>` sets the property whose
//! name is `<NAME>` in lower case with every `_` read as `.`
//! (`DEDUPQ__KAFKA__CLIENT__SASL_PASSWORD` -> `sasl.password`; no
//! librdkafka property has an underscore), and
//! `DEDUPQ__KAFKA__CLIENT_FILES__<NAME>` names the file of one.

use crate::config::{ConfigError, SecretUrl, Settings};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const CLIENT_PREFIX: &str = "DEDUPQ__KAFKA__CLIENT__";
const CLIENT_FILES_PREFIX: &str = "DEDUPQ__KAFKA__CLIENT_FILES__";

/// Whether a `DEDUPQ__…` variable (without the prefix) is handled here
/// rather than by the generic `section__field` mapping.
pub(super) fn is_client_variable(key_after_prefix: &str) -> bool {
    key_after_prefix
        .to_ascii_lowercase()
        .starts_with("kafka__client")
}

/// Applies `[kafka.client]` variables, then every `*_file` setting.
pub(super) fn resolve(
    settings: &mut Settings,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, value) in vars {
        if let Some(rest) = name.strip_prefix(CLIENT_FILES_PREFIX) {
            settings
                .kafka
                .client_files
                .insert(property_name(rest), PathBuf::from(value));
        } else if let Some(rest) = name.strip_prefix(CLIENT_PREFIX) {
            settings.kafka.client.insert(property_name(rest), value);
        }
    }
    resolve_files(settings)
}

/// `SASL_PASSWORD` -> `sasl.password`.
fn property_name(variable: &str) -> String {
    variable.to_ascii_lowercase().replace('_', ".")
}

fn resolve_files(s: &mut Settings) -> Result<(), ConfigError> {
    if let Some(path) = &s.store.url_file {
        s.store.url = SecretUrl::new(read_secret("store.url_file", path)?);
    }
    if let Some(path) = &s.amqp.url_file {
        s.amqp.url = SecretUrl::new(read_secret("amqp.url_file", path)?);
    }
    if let Some(path) = &s.handler.url_file {
        s.handler.url = read_secret("handler.url_file", path)?;
    }
    let files: BTreeMap<String, PathBuf> = s.kafka.client_files.clone();
    for (property, path) in &files {
        if s.kafka.client.contains_key(property) {
            return Err(ConfigError::new(
                &format!("kafka.client_files.{property}"),
                format!("`{property}` is also set in [kafka.client]"),
                "set each librdkafka property in one place only",
            ));
        }
        let setting = format!("kafka.client_files.{property}");
        let value = read_secret(&setting, path)?;
        s.kafka.client.insert(property.clone(), value);
    }
    Ok(())
}

fn read_secret(setting: &str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            setting,
            format!("cannot read {}: {e}", path.display()),
            "mount the secret file at that path, or remove the setting",
        )
    })?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(ConfigError::new(
            setting,
            format!("{} is empty", path.display()),
            "write the secret into the file",
        ));
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn a_dotted_librdkafka_property_is_set_from_its_underscored_variable() {
        let mut s = Settings::default();
        resolve(
            &mut s,
            vars(&[
                ("DEDUPQ__KAFKA__CLIENT__SASL_PASSWORD", "pw"),
                ("DEDUPQ__KAFKA__CLIENT__SECURITY_PROTOCOL", "SASL_SSL"),
                ("DEDUPQ__STORE__URL", "ignored here"),
            ]),
        )
        .unwrap();
        assert_eq!(s.kafka.client["sasl.password"], "pw");
        assert_eq!(s.kafka.client["security.protocol"], "SASL_SSL");
        assert_eq!(s.kafka.client.len(), 2);
    }

    #[test]
    fn a_missing_secret_file_names_the_setting() {
        let mut s = Settings::default();
        s.kafka
            .client_files
            .insert("sasl.password".into(), "/nonexistent/pw".into());
        let e = resolve(&mut s, vars(&[])).unwrap_err();
        assert_eq!(e.setting, "kafka.client_files.sasl.password");
        assert!(e.problem.contains("/nonexistent/pw"), "{e}");
    }
}
