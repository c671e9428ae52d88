use crate::support::{self, handlers::Recording};
use dedupq::engine::{Action, Outcome};
use std::sync::Arc;

fn replayed_tenant(action: &Action) -> String {
    match action {
        Action::Commit { reply: Some(r) } => support::json_of(&r.body)["tenant"]
            .as_str()
            .unwrap()
            .to_string(),
        other => panic!("expected a commit with a result, got {other:?}"),
    }
}

#[tokio::test]
async fn one_key_under_two_tenants_is_two_operations_each_replaying_its_own_result() {
    let (store, _) = support::isolated_store().await;
    let handler = Arc::new(Recording::default());
    let engine = support::engine(&store, handler.clone(), support::fast_options());
    let body = r#"{"amount": 10}"#;

    let first = engine
        .process(&[
            support::message("acme", "k-1", body),
            support::message("globex", "k-1", body),
        ])
        .await
        .unwrap();
    assert!(first.iter().all(|d| d.outcome == Outcome::Processed));
    assert_eq!(handler.count(), 2);
    let keys: Vec<_> = handler.calls().into_iter().map(|c| c.derived_key).collect();
    assert!(keys.contains(&"acme:k-1".to_string()) && keys.contains(&"globex:k-1".to_string()));

    let again = engine
        .process(&[
            support::message("globex", "k-1", body),
            support::message("acme", "k-1", body),
        ])
        .await
        .unwrap();
    assert_eq!(again[0].outcome, Outcome::Duplicate);
    assert_eq!(replayed_tenant(&again[0].action), "globex");
    assert_eq!(replayed_tenant(&again[1].action), "acme");
    assert_eq!(handler.count(), 2);
}
