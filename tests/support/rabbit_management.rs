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

/// `PUT /api/policies/%2f/<name>` applying `definition` to queues whose
/// name matches `pattern`. Only the policy of highest priority applies
/// to a queue, so `definition` replaces the test expiry policy there.
pub async fn put_policy(name: &str, pattern: &str, definition: serde_json::Value) {
    client()
        .put(format!("{}/api/policies/%2f/{name}", api()))
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({
            "pattern": pattern,
            "definition": definition,
            "apply-to": "queues",
            "priority": 10
        }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: put policy");
}

/// `DELETE /api/policies/%2f/<name>` (best effort).
pub async fn delete_policy(name: &str) {
    let _ = client()
        .delete(format!("{}/api/policies/%2f/{name}", api()))
        .basic_auth("guest", Some("guest"))
        .send()
        .await;
}

/// `GET /api/connections`: the open connections whose client-given name is
/// `name`, each as the API describes it (`connected_at` tells one
/// connection from a later one).
pub async fn connections_named(name: &str) -> Vec<serde_json::Value> {
    let all: Vec<serde_json::Value> = client()
        .get(format!("{}/api/connections", api()))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: connections")
        .json()
        .await
        .expect("connections JSON");
    all.into_iter()
        .filter(|c| c["client_properties"]["connection_name"] == name)
        .collect()
}

/// `DELETE /api/connections/<name>`: the broker closes the connection
/// (`connection.close` with 320, CONNECTION_FORCED), as when an operator
/// or a node shutdown ends it.
pub async fn close_connection(connection: &serde_json::Value) {
    let name = connection["name"].as_str().expect("a connection's name");
    let mut url = reqwest::Url::parse(&api()).expect("management URL");
    url.path_segments_mut()
        .expect("a base URL")
        .extend(["api", "connections", name]);
    client()
        .delete(url)
        .basic_auth("guest", Some("guest"))
        .header("X-Reason", "closed by a test")
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: close a connection");
}

/// `PUT /api/users/<name>`: a user without tags (no management access).
pub async fn put_user(name: &str, password: &str) {
    client()
        .put(format!("{}/api/users/{name}", api()))
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({ "password": password, "tags": "" }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: put user");
}

/// `DELETE /api/users/<name>` (best effort).
pub async fn delete_user(name: &str) {
    let _ = client()
        .delete(format!("{}/api/users/{name}", api()))
        .basic_auth("guest", Some("guest"))
        .send()
        .await;
}

/// `PUT /api/permissions/%2f/<user>`: what `user` may configure, write
/// and read in the default virtual host, each a regular expression over
/// resource names. A channel keeps the checks it passed: a change binds
/// new channels.
pub async fn put_permissions(user: &str, configure: &str, write: &str, read: &str) {
    client()
        .put(format!("{}/api/permissions/%2f/{user}", api()))
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({ "configure": configure, "write": write, "read": read }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("management API: put permissions");
}
