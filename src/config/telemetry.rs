//! Trace export settings (`[telemetry]`) and their start-up checks. Off by
//! default: no exporter, and spans cost next to nothing.

use crate::config::{redact_url, ConfigError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OtlpProtocol {
    /// OTLP over gRPC (a collector's port 4317).
    #[default]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    Http,
}

/// `[telemetry]`: trace export over OTLP.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Export spans over OTLP.
    pub enabled: bool,
    /// The collector. gRPC: `http://host:4317`; HTTP: the base URL
    /// (`http://host:4318`), to which `/v1/traces` is appended.
    pub endpoint: String,
    /// `telemetry.protocol` (default `grpc`): `grpc`, or `http` for
    /// OTLP/HTTP with protobuf bodies.
    pub protocol: OtlpProtocol,
    /// `service.name` of every span.
    pub service_name: String,
    /// `[telemetry.resource_attributes]`: more attributes of the resource
    /// every span is exported with (e.g. `deployment.environment`); a
    /// `service.name` here is overridden by `service_name`.
    pub resource_attributes: BTreeMap<String, String>,
    /// Share of the traces started here that are kept (0.0..=1.0). A
    /// message whose `traceparent` says sampled (or not) is followed.
    pub sampling_ratio: f64,
    /// How long one export may take before it is given up.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
    /// A CA (PEM) trusted for an `https://` collector besides the public
    /// roots, e.g. a private CA of an in-house collector.
    pub ca_file: Option<PathBuf>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: "http://127.0.0.1:4317".into(),
            protocol: OtlpProtocol::Grpc,
            service_name: "dedupq".into(),
            resource_attributes: BTreeMap::new(),
            sampling_ratio: 1.0,
            export_timeout: Duration::from_secs(10),
            ca_file: None,
        }
    }
}

impl TelemetrySettings {
    /// Checked only when export is on: a disabled section may hold anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        let url = url::Url::parse(&self.endpoint).ok();
        let scheme = url.as_ref().map(url::Url::scheme);
        let allowed = matches!(scheme, Some("http" | "https"));
        if !allowed || url.as_ref().is_some_and(|u| u.host().is_none()) {
            return Err(ConfigError::new(
                "telemetry.endpoint",
                format!(
                    "'{}' is not a collector URL for protocol {:?}",
                    redact_url(&self.endpoint),
                    self.protocol
                ),
                "use http(s)://host:4317 (grpc) or http(s)://host:4318 (http)",
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::new(
                "telemetry.service_name",
                "is empty",
                "name the service as traces should show it, e.g. dedupq",
            ));
        }
        if self.resource_attributes.keys().any(|k| k.trim().is_empty()) {
            return Err(ConfigError::new(
                "telemetry.resource_attributes",
                "has an empty key",
                "name each attribute, e.g. deployment.environment = \"prod\"",
            ));
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(ConfigError::new(
                "telemetry.sampling_ratio",
                format!("{} is not between 0.0 and 1.0", self.sampling_ratio),
                "1.0 keeps every trace, 0.1 one in ten",
            ));
        }
        if self.export_timeout.is_zero() {
            return Err(ConfigError::new(
                "telemetry.export_timeout",
                "must be longer than zero",
                "the default is 10s",
            ));
        }
        self.ca_pem().map(|_| ())
    }

    /// The PEM text of `telemetry.ca_file`, if set: a file that cannot be
    /// read or holds no certificate stops start-up naming the setting.
    pub fn ca_pem(&self) -> Result<Option<String>, ConfigError> {
        self.ca_file
            .as_deref()
            .map(|path| super::read_ca_pem("telemetry.ca_file", path, "the collector's"))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> TelemetrySettings {
        TelemetrySettings {
            enabled: true,
            ..TelemetrySettings::default()
        }
    }

    fn refused(s: TelemetrySettings) -> String {
        s.validate().expect_err("refused").setting
    }

    #[test]
    fn the_defaults_turned_on_are_valid() {
        on().validate().expect("valid");
    }

    #[test]
    fn a_disabled_section_is_not_checked() {
        let s = TelemetrySettings {
            endpoint: "nonsense".into(),
            ..TelemetrySettings::default()
        };
        s.validate().expect("off: not checked");
    }

    #[test]
    fn each_bad_value_names_its_setting() {
        let endpoint = |e: &str, protocol| TelemetrySettings {
            endpoint: e.into(),
            protocol,
            ..on()
        };
        for bad in ["localhost:4317", "ftp://h:1", "http://"] {
            assert_eq!(
                refused(endpoint(bad, OtlpProtocol::Grpc)),
                "telemetry.endpoint",
                "{bad}"
            );
        }
        endpoint("https://collector:4318", OtlpProtocol::Http)
            .validate()
            .expect("https over OTLP/HTTP");
        endpoint("https://collector:4317", OtlpProtocol::Grpc)
            .validate()
            .expect("https over OTLP/gRPC");
        let missing = TelemetrySettings {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..on()
        };
        assert_eq!(refused(missing), "telemetry.ca_file");
        let text = std::env::temp_dir().join(format!("not-a-ca-{}.txt", std::process::id()));
        std::fs::write(&text, "no certificate here\n").unwrap();
        let not_pem = TelemetrySettings {
            ca_file: Some(text),
            ..on()
        };
        assert_eq!(refused(not_pem), "telemetry.ca_file");
        for ratio in [-0.1, 1.5, f64::NAN] {
            let s = TelemetrySettings {
                sampling_ratio: ratio,
                ..on()
            };
            assert_eq!(refused(s), "telemetry.sampling_ratio", "{ratio}");
        }
        let s = TelemetrySettings {
            service_name: " ".into(),
            ..on()
        };
        assert_eq!(refused(s), "telemetry.service_name");
        let s = TelemetrySettings {
            export_timeout: Duration::ZERO,
            ..on()
        };
        assert_eq!(refused(s), "telemetry.export_timeout");
    }
}
