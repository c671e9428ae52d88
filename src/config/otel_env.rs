//! The standard OpenTelemetry variables, as a layer of `[telemetry]`
//! between the defaults and the configuration file: they fill in what the
//! file does not set, and `DEDUPQ__TELEMETRY__…` still wins over both.
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` -> `telemetry.endpoint`, and turns
//!   export on (unless the file says `enabled = false`);
//! - `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc` or `http/protobuf`) ->
//!   `telemetry.protocol`;
//! - `OTEL_SERVICE_NAME` -> `telemetry.service_name`;
//! - `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`, values percent-decoded) ->
//!   `telemetry.resource_attributes`; a `service.name` in it names the
//!   service unless `OTEL_SERVICE_NAME` is set.
//!
//! An empty variable counts as unset; a bad value stops start-up naming it.

use crate::config::{ConfigError, OtlpProtocol};
use figment::providers::Serialized;
use serde::Serialize;
use std::collections::BTreeMap;

/// Reads one variable; injected so that tests need not touch the process
/// environment.
pub(super) type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// The `[telemetry]` settings the variables give; unset ones are left out,
/// so the layer below shows through.
#[derive(Debug, Default, PartialEq, Serialize)]
struct Layer {
    #[serde(skip_serializing_if = "Option::is_none")]
    enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol: Option<OtlpProtocol>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_name: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    resource_attributes: BTreeMap<String, String>,
}

/// The variables' layer of the configuration.
pub(super) fn provider(lookup: Lookup<'_>) -> Result<impl figment::Provider, ConfigError> {
    Ok(Serialized::default("telemetry", layer(lookup)?))
}

fn layer(lookup: Lookup<'_>) -> Result<Layer, ConfigError> {
    let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let mut layer = Layer::default();
    if let Some(endpoint) = var(ENDPOINT) {
        check_endpoint(&endpoint)?;
        layer.enabled = Some(true);
        layer.endpoint = Some(endpoint);
    }
    layer.protocol = var(PROTOCOL).map(|p| protocol(&p)).transpose()?;
    if let Some(list) = var(RESOURCE_ATTRIBUTES) {
        layer.resource_attributes = resource_attributes(&list)?;
    }
    // The spec's order: OTEL_SERVICE_NAME, then service.name in the list.
    let listed = layer.resource_attributes.remove("service.name");
    layer.service_name = var(SERVICE_NAME).or(listed);
    Ok(layer)
}

fn check_endpoint(endpoint: &str) -> Result<(), ConfigError> {
    let url = url::Url::parse(endpoint).ok();
    let usable = url
        .as_ref()
        .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    if usable {
        return Ok(());
    }
    Err(ConfigError::for_variable(
        "telemetry.endpoint",
        ENDPOINT,
        format!("'{}' is not a collector URL", super::redact_url(endpoint)),
        "use http(s)://host:4317 (grpc) or http(s)://host:4318 (http/protobuf)",
    ))
}

fn protocol(value: &str) -> Result<OtlpProtocol, ConfigError> {
    match value.trim() {
        "grpc" => Ok(OtlpProtocol::Grpc),
        "http/protobuf" => Ok(OtlpProtocol::Http),
        other => Err(ConfigError::for_variable(
            "telemetry.protocol",
            PROTOCOL,
            format!("'{other}' is not a protocol dedupq exports with"),
            "use grpc or http/protobuf (http/json is not supported)",
        )),
    }
}

/// `k=v,k2=v2` -> the map; keys and values trimmed, values
/// percent-decoded, empty members skipped.
fn resource_attributes(list: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let refuse = |problem: String| {
        ConfigError::for_variable(
            "telemetry.resource_attributes",
            RESOURCE_ATTRIBUTES,
            problem,
            "write key=value pairs separated by commas, with %XX for a comma, = or % in a value",
        )
    };
    let mut attributes = BTreeMap::new();
    for member in list.split(',').filter(|m| !m.trim().is_empty()) {
        let Some((key, value)) = member.split_once('=') else {
            return Err(refuse(format!("'{member}' has no '='")));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(refuse(format!("'{member}' has no key")));
        }
        let value = percent_decode(value.trim())
            .ok_or_else(|| refuse(format!("the value of '{key}' is not percent-encoded UTF-8")))?;
        attributes.insert(key.to_string(), value);
    }
    Ok(attributes)
}

/// `%XX` escapes decoded; None for a broken escape or a result that is not
/// UTF-8.
fn percent_decode(value: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use figment::providers::{Format, Toml};

    fn env(list: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            list.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    /// The configuration from these variables and this file, layered as
    /// `Settings::load` does (without `DEDUPQ__…` variables).
    fn load(vars: &'static [(&'static str, &'static str)], file: &str) -> Settings {
        super::super::layers(&env(vars))
            .unwrap()
            .merge(Toml::string(file))
            .extract()
            .unwrap()
    }

    fn refused(vars: &'static [(&'static str, &'static str)]) -> ConfigError {
        layer(&env(vars)).expect_err("refused")
    }

    #[test]
    fn resource_attributes_are_pairs_with_percent_decoded_values() {
        let parsed =
            resource_attributes(" deployment.environment = prod ,team=pay%2Cments,,note=a%3Db%20c")
                .unwrap();
        assert_eq!(parsed["deployment.environment"], "prod");
        assert_eq!(parsed["team"], "pay,ments");
        assert_eq!(parsed["note"], "a=b c");
        assert_eq!(parsed.len(), 3);
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
    }

    #[test]
    fn a_bad_resource_attribute_list_names_the_variable() {
        for bad in [
            &[(RESOURCE_ATTRIBUTES, "team")][..],
            &[(RESOURCE_ATTRIBUTES, "=x")],
            &[(RESOURCE_ATTRIBUTES, "team=%zz")],
            &[(RESOURCE_ATTRIBUTES, "team=%4")],
            &[(RESOURCE_ATTRIBUTES, "team=%FF")],
        ] {
            let e = refused(bad);
            assert_eq!(e.setting, "telemetry.resource_attributes", "{bad:?}");
            assert!(e.to_string().contains(RESOURCE_ATTRIBUTES), "{e}");
        }
        let e = refused(&[(ENDPOINT, "collector:4317")]);
        assert_eq!(e.env, ENDPOINT);
        let e = refused(&[(PROTOCOL, "http/json")]);
        assert_eq!(e.env, PROTOCOL);
    }

    #[test]
    fn the_variables_fill_in_what_the_file_does_not_set() {
        let s = load(
            &[
                (ENDPOINT, "http://collector:4318"),
                (PROTOCOL, "http/protobuf"),
                (SERVICE_NAME, "payments-dedupq"),
                (RESOURCE_ATTRIBUTES, "service.name=ignored,region=eu-1"),
            ],
            "",
        );
        let t = s.telemetry;
        assert!(t.enabled, "an endpoint turns export on");
        assert_eq!(t.endpoint, "http://collector:4318");
        assert_eq!(t.protocol, OtlpProtocol::Http);
        assert_eq!(t.service_name, "payments-dedupq", "OTEL_SERVICE_NAME wins");
        assert_eq!(
            t.resource_attributes,
            BTreeMap::from([("region".to_string(), "eu-1".to_string())])
        );
        let listed = load(&[(RESOURCE_ATTRIBUTES, "service.name=from-list")], "");
        assert_eq!(listed.telemetry.service_name, "from-list");
        assert!(!listed.telemetry.enabled, "no endpoint: export stays off");
    }

    #[test]
    fn the_file_wins_over_the_variables() {
        let s = load(
            &[
                (ENDPOINT, "http://collector:4317"),
                (SERVICE_NAME, "from-env"),
                (RESOURCE_ATTRIBUTES, "region=eu-1,team=pay"),
            ],
            "[telemetry]\nenabled = false\nservice_name = \"from-file\"\n\
             resource_attributes = { region = \"us-2\" }\n",
        );
        let t = s.telemetry;
        assert!(!t.enabled, "an explicit enabled = false stays off");
        assert_eq!(t.endpoint, "http://collector:4317");
        assert_eq!(t.service_name, "from-file");
        assert_eq!(t.resource_attributes["region"], "us-2");
        assert_eq!(t.resource_attributes["team"], "pay", "merged per key");
    }

    #[test]
    fn without_the_variables_the_defaults_stand() {
        let s = load(&[(ENDPOINT, ""), (SERVICE_NAME, " ")], "");
        assert!(!s.telemetry.enabled);
        assert_eq!(s.telemetry.service_name, "dedupq");
    }
}
