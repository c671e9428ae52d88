//! The broker stops letting dedupq's principal read its topic mid-stream
//! (an ACL denied, then put right): fetches are refused and nothing is
//! consumed meanwhile, dedupq stays up, and once reads are allowed again
//! it goes on where it was: every payment charged once, the group
//! committed to the end, no restart.

use super::common::{body, TENANT};
use crate::support::endpoints::endpoints;
use crate::support::kafka;
use crate::support::kafka_acl::{self, Acl, Operation, Permission, Resource};
use crate::support::process::{base_config, Dedupq, Provider};
use crate::support::{eventually, isolated_store, unique};
use dedupq_provider::Knobs;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_refused_by_an_acl_mid_stream_resume_once_it_is_put_right() {
    let user = unique("unread");
    kafka_acl::create_user(&user, &endpoints().kafka_password()).await;
    let allow = |resource| Acl {
        resource,
        operation: Operation::All,
        permission: Permission::Allow,
    };
    kafka_acl::add(
        &user,
        &[allow(Resource::Cluster), allow(Resource::Topic("*"))],
    )
    .await;

    let (_store, store_settings) = isolated_store().await;
    let provider = Provider::start(Knobs::default()).await;
    let (topic, _) = kafka::topics("unread", 2).await;
    let group = unique("g");
    let config = kafka_acl::with_kafka_as(
        &base_config(&store_settings, &provider),
        &topic,
        &group,
        &user,
    );
    let mut dedupq = Dedupq::start(&config).await;

    const N: usize = 150;
    let feed = kafka::paced_payments(&topic, 2, TENANT, N, Duration::from_millis(40), body);
    eventually(Duration::from_secs(60), "payments charged", || async {
        (provider.stats().await.charges >= 10).then_some(())
    })
    .await;

    kafka_acl::add(
        &user,
        &[Acl {
            resource: Resource::Topic(&topic),
            operation: Operation::Read,
            permission: Permission::Deny,
        }],
    )
    .await;
    // Refused: what was fetched before is charged, then nothing more.
    let stopped_at = eventually(Duration::from_secs(60), "charging stopped", || async {
        let before = provider.stats().await.charges;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = provider.stats().await.charges;
        (after == before).then_some(after)
    })
    .await;
    assert!(
        (stopped_at as usize) < N,
        "the refusal came before the last payment ({stopped_at} of {N} charged)"
    );
    assert!(dedupq.alive(), "dedupq stays up:\n{}", dedupq.log_tail());

    kafka_acl::remove(&user, Permission::Deny).await;
    feed.await.expect("producer task");
    kafka::wait_committed_to_end(&group, &topic, 2, Duration::from_secs(120)).await;
    provider.charged_once_each(N).await;
    assert!(dedupq.alive(), "dedupq stays up:\n{}", dedupq.log_tail());
    dedupq.kill();
}
