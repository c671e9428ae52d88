//! A producer librdkafka has made fatal is replaced, not kept: once the
//! broker refuses dedupq's principal a producer id (its ACLs lost
//! `IdempotentWrite` and every topic's `Write`), every record on that
//! client fails with `_FATAL`, whatever the broker says later. dedupq
//! builds a new one, so a dead letter lands, and its partition moves on,
//! as soon as the operator restores the ACLs; no restart.

use super::common::{body, TENANT};
use crate::support::endpoints::endpoints;
use crate::support::kafka::{self, headers, produce};
use crate::support::kafka_acl::{self, Acl, Operation, Permission, Resource};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_producer_the_broker_made_fatal_is_replaced_and_the_dead_letter_lands_once_the_acls_are_restored(
) {
    let ep = endpoints();
    let user = unique("refused");
    kafka_acl::create_user(&user, &ep.kafka_password()).await;
    // Everything but writing: the consumer reads and commits, the start-up
    // checks describe the topics, and no producer id is granted.
    let allow = |resource| Acl {
        resource,
        operation: Operation::All,
        permission: Permission::Allow,
    };
    let deny = |resource, operation| Acl {
        resource,
        operation,
        permission: Permission::Deny,
    };
    kafka_acl::add(
        &user,
        &[
            allow(Resource::Cluster),
            allow(Resource::Topic("*")),
            deny(Resource::Cluster, Operation::IdempotentWrite),
            deny(Resource::Topic("*"), Operation::Write),
        ],
    )
    .await;

    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, dlq) = kafka::topics("refused", 1).await;
    let group = unique("g");
    let config = kafka_acl::with_kafka_as(
        &base_config(&store_settings, &provider),
        &topic,
        &group,
        &user,
    );
    let mut dedupq = Dedupq::start(&config).await;

    // A message without a key (dead-lettered), then a payment behind it.
    let producer = kafka::producer();
    produce(
        &producer,
        &topic,
        0,
        &[("client-id".into(), TENANT.as_bytes().to_vec())],
        &body(0),
    )
    .await;
    produce(&producer, &topic, 0, &headers(TENANT, "after"), &body(1)).await;

    // The dead letter meets the fatal client, and is tried again.
    let said = eventually(
        Duration::from_secs(60),
        "a dead letter refused by the fatal producer",
        || async {
            let log = dedupq.log();
            (log.contains("produce failed") && log.contains("Fatal")).then_some(log)
        },
    )
    .await;
    assert!(
        said.contains("ClusterAuthorizationFailed") || said.contains("CLUSTER_AUTHORIZATION"),
        "the fatal state's reason is the broker's refusal:\n{said}"
    );
    assert_eq!(
        kafka::end_offsets(&dlq, 1).await,
        [0],
        "nothing could be written yet"
    );

    let failed = r#"dedupq_dead_letters_failed_total{transport="kafka"}"#;
    assert!(
        dedupq.metric(failed).await >= 1.0,
        "{failed} counts the tries"
    );

    kafka_acl::remove(&user, Permission::Deny).await;
    let committed = kafka::wait_committed_to_end(&group, &topic, 1, Duration::from_secs(90)).await;
    assert_eq!(committed, [2]);
    assert_eq!(kafka::end_offsets(&dlq, 1).await, [1], "one dead letter");
    provider.charged_once_each(1).await;
    assert!(
        dedupq.exit_status().is_none(),
        "dedupq stayed up:\n{}",
        dedupq.log_tail()
    );
    dedupq.kill();
}
