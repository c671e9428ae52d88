//! `handler.lookup_url` is asked once at start-up for a key that was never
//! charged. A URL answering 200 for it (the charge listing, one path
//! segment off the lookup) would settle uncertain keys `done` with no
//! charge behind them: start-up is refused, naming the setting. A lookup
//! that cannot be reached yet does not stop start-up.

use crate::support::isolated_store;
use crate::support::process::{free_port, Provider};
use dedupq::config::{HandlerSettings, HttpSettings, Settings, StoreSettings};
use dedupq::startup::Application;
use dedupq_provider::Knobs;

fn settings(store: StoreSettings, provider: &Provider, lookup_url: String) -> Settings {
    Settings {
        store,
        http: HttpSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..HttpSettings::default()
        },
        handler: HandlerSettings {
            url: provider.charges_url(),
            lookup_url: Some(lookup_url),
            ..HandlerSettings::default()
        },
        ..Settings::default()
    }
}

#[tokio::test]
async fn a_lookup_url_pointing_at_the_charge_listing_stops_start_up_naming_the_setting() {
    let provider = Provider::start(Knobs::default()).await;
    let (_, store) = isolated_store().await;
    let listing = format!("{}/charges?key={{derived_key}}", provider.base);

    let built = Application::build(settings(store, &provider, listing)).await;

    let error = format!("{:#}", built.err().expect("start-up is refused"));
    assert!(
        error.contains("handler.lookup_url")
            && error.contains("answers 200 for a key that was never charged"),
        "the error names the setting and why: {error}"
    );
}

#[tokio::test]
async fn a_lookup_that_finds_no_charge_for_an_unknown_key_or_cannot_be_reached_lets_dedupq_start() {
    let provider = Provider::start(Knobs::default()).await;
    let unreachable = format!(
        "http://127.0.0.1:{}/charges/lookup?key={{derived_key}}",
        free_port()
    );
    for lookup_url in [
        format!("{}/charges/lookup?key={{derived_key}}", provider.base),
        unreachable,
    ] {
        let (_, store) = isolated_store().await;

        let built = Application::build(settings(store, &provider, lookup_url.clone())).await;

        let app = built.unwrap_or_else(|e| panic!("{lookup_url}: start-up refused: {e:#}"));
        app.shutdown_token().cancel();
    }
}
