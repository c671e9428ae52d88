//! The examples of docs/production.md are the settings these tests run with:
//! they parse, and they name the local TLS endpoints and files.

use crate::support::endpoints::endpoints;
use crate::support::fenced_blocks;
use dedupq::config::Settings;

fn production_section() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/production.md")).unwrap()
}

#[test]
fn the_production_examples_parse_and_use_the_endpoints_the_tests_use() {
    let ep = endpoints();
    let section = production_section();
    let examples: Vec<Settings> = fenced_blocks(&section, "toml fragment")
        .iter()
        .map(|b| toml::from_str(b).unwrap_or_else(|e| panic!("{e}\n{b}")))
        .collect();
    let kafka = examples
        .iter()
        .find(|s| !s.kafka.topics.is_empty())
        .expect("a Kafka example");
    assert_eq!(kafka.kafka.brokers, ep.get("KAFKA_SASL_BROKERS"));
    for (k, v) in ep.kafka_client(&ep.ca()) {
        assert_eq!(kafka.kafka.client.get(&k), Some(&v), "{k}");
    }
    assert_eq!(
        kafka.kafka.client_files["sasl.password"]
            .display()
            .to_string(),
        ep.get("KAFKA_SASL_PASSWORD_FILE")
    );

    let amqp = examples
        .iter()
        .find(|s| !s.amqp.queues.is_empty())
        .expect("a RabbitMQ example");
    assert_eq!(amqp.amqp.url.expose(), ep.get("AMQPS_URL"));
    assert_eq!(
        amqp.amqp
            .tls_ca_file
            .as_ref()
            .unwrap()
            .display()
            .to_string(),
        ep.ca()
    );
    amqp.validate().expect("the RabbitMQ example is valid here");

    let tls_query = ep.get("DATABASE_TLS_URL");
    let tls_query = tls_query.split_once('?').unwrap().1;
    assert!(
        section.contains(tls_query),
        "the PostgreSQL example uses ?{tls_query}"
    );
}
