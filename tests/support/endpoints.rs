//! The TLS and SASL endpoints of the local services, as `scripts/services
//! up` wrote them to `$DEDUPQ_SERVICES_DIR/services.env`.

use dedupq::config::KafkaSettings;
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub struct Endpoints(BTreeMap<String, String>);

/// Reads `services.env`; panics with the fix if the services were started
/// by an older script.
pub fn endpoints() -> Endpoints {
    let dir =
        std::env::var("DEDUPQ_SERVICES_DIR").unwrap_or_else(|_| "/var/tmp/dedupq-services".into());
    let path = PathBuf::from(dir).join("services.env");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/services up", path.display()));
    Endpoints(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

impl Endpoints {
    pub fn get(&self, name: &str) -> String {
        self.0
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing from services.env; run scripts/services up"))
    }

    /// The CA that signed every local server certificate.
    pub fn ca(&self) -> String {
        self.get("DEDUPQ_TLS_CA")
    }

    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> String {
        self.get("DEDUPQ_TLS_OTHER_CA")
    }

    pub fn kafka_password(&self) -> String {
        let path = self.get("KAFKA_SASL_PASSWORD_FILE");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .trim()
            .to_string()
    }

    /// `[kafka.client]` of a SASL_SSL client that verifies the broker
    /// against `ca`; the password is left out (it comes from a file).
    pub fn kafka_client(&self, ca: &str) -> BTreeMap<String, String> {
        [
            ("security.protocol", "SASL_SSL".to_string()),
            ("sasl.mechanisms", self.get("KAFKA_SASL_MECHANISM")),
            ("sasl.username", self.get("KAFKA_SASL_USERNAME")),
            ("ssl.ca.location", ca.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// A librdkafka configuration for the SASL_SSL listener, password set.
    pub fn kafka_config(&self, ca: &str) -> ClientConfig {
        let mut settings = KafkaSettings::at(&self.get("KAFKA_SASL_BROKERS"));
        settings.client = self.kafka_client(ca);
        settings
            .client
            .insert("sasl.password".into(), self.kafka_password());
        dedupq::broker::kafka::client(&settings, "dedupq-test")
    }
}
