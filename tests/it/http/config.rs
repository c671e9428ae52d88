//! Bad `[api]` settings stop start-up with the setting's name.

use super::harness::{keys_file, scratch, sync_route};
use crate::support::handlers::Recording;
use crate::support::{engine, fast_options, isolated_store};
use dedupq::config::{Settings, TenantSource};
use dedupq::transport::http::{Api, ApiError};
use std::net::SocketAddr;
use std::sync::Arc;

fn enabled() -> Settings {
    let mut s = Settings::default();
    s.api.enabled = true;
    s.api.keys_file = Some(keys_file(&scratch()));
    s.api.routes = vec![sync_route("payments")];
    s
}

fn refused(s: &Settings) -> String {
    s.validate().expect_err("refused at start-up").setting
}

fn route(text: &str) -> dedupq::config::RouteSettings {
    toml::from_str(text).expect("route")
}

#[test]
fn start_up_refuses_an_api_nobody_can_authenticate_to_or_that_trusts_a_client_header() {
    enabled().validate().expect("a valid API");
    let mut s = enabled();
    s.api.keys_file = None;
    assert_eq!(refused(&s), "api.keys_file");
    s.api.tenant_header = Some("x-tenant".into());
    assert_eq!(refused(&s), "api.trusted_gateway");
    s.api.trusted_gateway = true;
    s.validate().expect("a trusted gateway's header");
    let mut s = enabled();
    s.identity.tenant = TenantSource::Body {
        pointer: "/client_id".into(),
    };
    assert_eq!(refused(&s), "identity.tenant");
}

#[test]
fn start_up_refuses_routes_that_cannot_work_naming_the_route() {
    let mut s = enabled();
    s.api.routes = vec![route("name = \"pay ments\"")];
    assert_eq!(refused(&s), "api.routes[0].name");
    s.api.routes = vec![
        sync_route("payments"),
        route("name = \"later\"\nmode = \"async\""),
    ];
    assert_eq!(refused(&s), "api.routes[1].publish");
    s.api.routes = vec![route(
        "name = \"stripe\"\nwebhook = \"stripe\"\ntenant = \"acme\"",
    )];
    assert_eq!(refused(&s), "api.routes[0].secret_file");
    s.api.routes = vec![route(
        "name = \"hook\"\nwebhook = \"hmac\"\nsecret_file = \"/x\"\ntenant = \"acme\"",
    )];
    assert_eq!(refused(&s), "api.routes[0].signature_header");
    s.api.routes = vec![route("name = \"payments\"\ntenant = \"acme\"")];
    assert_eq!(
        refused(&s),
        "api.routes[0].tenant",
        "only webhooks have a fixed tenant"
    );
    s.api.routes = vec![sync_route("payments"), sync_route("payments")];
    assert_eq!(refused(&s), "api.routes[1].name");
    let mut s = enabled();
    s.api.listen = s.http.listen;
    assert_eq!(refused(&s), "api.listen");
}

async fn build(s: &Settings) -> Result<Api, ApiError> {
    let (store, _) = isolated_store().await;
    Api::build(
        s,
        Arc::new(engine(
            &store,
            Arc::new(Recording::default()),
            fast_options(),
        )),
        store,
    )
    .await
}

#[tokio::test]
async fn unreadable_or_weak_secrets_stop_start_up_without_printing_them() {
    let dir = scratch();
    let mut s = enabled();
    s.api.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let weak = dir.join("weak.toml");
    std::fs::write(&weak, "\"hunter2\" = \"acme\"\n").unwrap();
    s.api.keys_file = Some(weak);
    let Err(ApiError::Config(e)) = build(&s).await else {
        panic!("a short API key is refused");
    };
    assert_eq!(e.setting, "api.keys_file");
    assert!(!e.to_string().contains("hunter2"), "{e}");

    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "\"sk_live_0123456789abcdef\" = acme\n").unwrap();
    s.api.keys_file = Some(broken);
    let Err(ApiError::Config(e)) = build(&s).await else {
        panic!("a malformed keys file is refused");
    };
    assert!(
        e.to_string().contains("line 1") && !e.to_string().contains("sk_live"),
        "{e}"
    );

    s.api.keys_file = Some(keys_file(&dir));
    s.api.routes = vec![route(
        "name = \"stripe\"\nwebhook = \"stripe\"\ntenant = \"acme\"\nsecret_file = \"/nonexistent/secret\"",
    )];
    let Err(ApiError::Config(e)) = build(&s).await else {
        panic!("a missing secret file is refused");
    };
    assert_eq!(e.setting, "api.routes[0].secret_file");
}

#[test]
fn the_dedupq_binary_refuses_to_start_on_a_bad_api_setting_and_names_it() {
    let path = scratch().join("dedupq.toml");
    std::fs::write(
        &path,
        "[api]\nenabled = true\ntenant_header = \"x-tenant\"\nroutes = [{ name = \"payments\" }]\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupq"))
        .args(["config", "--config"])
        .arg(&path)
        .output()
        .expect("run dedupq");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid setting `api.trusted_gateway`"),
        "{stderr}"
    );
}

#[test]
fn the_documented_route_examples_are_valid_routes() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/http-api.md"))
        .expect("docs/http-api.md");
    let block = readme
        .split("```toml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or(""))
        .find(|b| b.contains("[[api.routes]]"))
        .expect("a block of route examples in docs/http-api.md");
    let keys = keys_file(&scratch());
    let text = format!(
        "[api]\nenabled = true\nkeys_file = \"{}\"\n{block}",
        keys.display()
    );
    let s: Settings = toml::from_str(&text).expect("the examples parse as settings");
    s.validate()
        .expect("the examples are a valid configuration");
    assert_eq!(s.api.routes.len(), 3);
}
