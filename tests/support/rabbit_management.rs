//! RabbitMQ's management HTTP API, for looking at queues without a client
//! library: it shows messages whose bytes lapin cannot parse.

use std::time::Duration;

fn api() -> String {
    std::env::var("RABBITMQ_MANAGEMENT_URL").unwrap_or_else(|_| "http://127.0.0.1:15672".into())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// Up to `count` messages at the head of `queue`, through `POST
/// /api/queues/%2f/<queue>/get`; they are put back (`reject_requeue_true`).
/// Two things to know: the API shows property strings and header names
/// with every invalid UTF-8 byte replaced by U+FFFD (header values that are
/// not UTF-8 become "Not UTF-8, base64 is: …", duplicate header names
/// collapse to the last), so it is lossy; and on a quorum queue each look
/// is a delivery that raises `x-delivery-count` (a peek counts toward
/// `x-delivery-limit`). `RawAmqp::get` reads the exact bytes.
pub async fn peek(queue: &str, count: u32) -> serde_json::Value {
    client()
        .post(format!("{}/api/queues/%2f/{queue}/get", api()))
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({
            "count": count,
            "ackmode": "reject_requeue_true",
            "encoding": "base64",
            "truncate": 1024
        }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: get messages")
        .json()
        .await
        .expect("management API answer")
}

/// `GET /api/queues/%2f/<queue>`: counts, arguments, consumers.
pub async fn queue_info(queue: &str) -> serde_json::Value {
    client()
        .get(format!("{}/api/queues/%2f/{queue}", api()))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: queue")
        .json()
        .await
        .expect("queue JSON")
}
