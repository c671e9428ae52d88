//! SCRAM users and ACLs on the test broker, through librdkafka's admin API
//! (rdkafka's safe API has neither). The broker runs `StandardAuthorizer`
//! with its listeners' own principals as super users
//! (`scripts/kafka/server.properties.in`): what a test grants or denies
//! here binds only the user it made.

use super::endpoints::endpoints;
use super::kafka::brokers;
use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use std::ffi::{c_char, CStr, CString};

/// The cluster resource's name in ACLs.
const CLUSTER: &str = "kafka-cluster";

/// What a principal is allowed or denied.
#[derive(Debug, Clone, Copy)]
pub enum Resource<'a> {
    Cluster,
    /// A topic by name; `"*"` is every topic.
    Topic(&'a str),
}

#[derive(Debug, Clone, Copy)]
pub enum Operation {
    All,
    Read,
    Write,
    IdempotentWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Allow,
    Deny,
}

/// One ACL of `User:<user>`, from any host.
#[derive(Debug, Clone, Copy)]
pub struct Acl<'a> {
    pub resource: Resource<'a>,
    pub operation: Operation,
    pub permission: Permission,
}

impl Operation {
    fn raw(self) -> rd::rd_kafka_AclOperation_t {
        use rd::rd_kafka_AclOperation_t as O;
        match self {
            Operation::All => O::RD_KAFKA_ACL_OPERATION_ALL,
            Operation::Read => O::RD_KAFKA_ACL_OPERATION_READ,
            Operation::Write => O::RD_KAFKA_ACL_OPERATION_WRITE,
            Operation::IdempotentWrite => O::RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE,
        }
    }
}

impl Permission {
    fn raw(self) -> rd::rd_kafka_AclPermissionType_t {
        use rd::rd_kafka_AclPermissionType_t as P;
        match self {
            Permission::Allow => P::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
            Permission::Deny => P::RD_KAFKA_ACL_PERMISSION_TYPE_DENY,
        }
    }
}

impl Acl<'_> {
    fn parts(&self) -> (rd::rd_kafka_ResourceType_t, CString) {
        match self.resource {
            Resource::Cluster => (
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_BROKER,
                CString::new(CLUSTER).unwrap(),
            ),
            Resource::Topic(name) => (
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
                CString::new(name).expect("a topic name without NUL"),
            ),
        }
    }
}

/// An admin client on the PLAINTEXT listener, whose principal is a super
/// user.
fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("an admin client")
}

/// Runs one admin request on its own queue and returns the error of each
/// of its results (`None` for a success); `start` sends it, `errors`
/// reads the result event.
fn request(
    start: impl FnOnce(*mut rd::rd_kafka_t, *mut rd::rd_kafka_queue_t),
    errors: impl FnOnce(*mut rd::rd_kafka_event_t) -> Vec<Option<String>>,
) -> Vec<Option<String>> {
    let admin = admin();
    let rk = admin.inner().native_ptr();
    // SAFETY: the queue and the event belong to `rk`, which `admin` keeps
    // alive until both are destroyed below.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        start(rk, queue);
        let event = rd::rd_kafka_queue_poll(queue, 60_000);
        assert!(!event.is_null(), "no answer to an admin request in 60 s");
        if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let why = text(rd::rd_kafka_event_error_string(event));
            rd::rd_kafka_event_destroy(event);
            rd::rd_kafka_queue_destroy(queue);
            panic!("admin request failed: {why}");
        }
        let out = errors(event);
        rd::rd_kafka_event_destroy(event);
        rd::rd_kafka_queue_destroy(queue);
        out
    }
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn text(s: *const c_char) -> String {
    if s.is_null() {
        String::new()
    } else {
        CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// # Safety
/// `e` is null or a live `rd_kafka_error_t` (some results carry one whose
/// code says no error).
unsafe fn error(e: *const rd::rd_kafka_error_t) -> Option<String> {
    let failed = !e.is_null()
        && rd::rd_kafka_error_code(e) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
    failed.then(|| text(rd::rd_kafka_error_string(e)))
}

fn all_ok(what: &str, results: Vec<Option<String>>) {
    let failed: Vec<String> = results.into_iter().flatten().collect();
    assert!(failed.is_empty(), "{what}: {failed:?}");
}

/// Makes (or resets) the SCRAM-SHA-512 user `name` with `password`.
pub async fn create_user(name: &str, password: &str) {
    let (name, password) = (name.to_string(), password.to_string());
    tokio::task::spawn_blocking(move || {
        let user = CString::new(name.as_str()).unwrap();
        let results = request(
            |rk, queue| unsafe {
                let mut alterations = [rd::rd_kafka_UserScramCredentialUpsertion_new(
                    user.as_ptr(),
                    rd::rd_kafka_ScramMechanism_t::RD_KAFKA_SCRAM_MECHANISM_SHA_512,
                    4096,
                    password.as_ptr(),
                    password.len(),
                    std::ptr::null(),
                    0,
                )];
                rd::rd_kafka_AlterUserScramCredentials(
                    rk,
                    alterations.as_mut_ptr(),
                    alterations.len(),
                    std::ptr::null(),
                    queue,
                );
                rd::rd_kafka_UserScramCredentialAlteration_destroy_array(
                    alterations.as_mut_ptr(),
                    alterations.len(),
                );
            },
            |event| unsafe {
                let result = rd::rd_kafka_event_AlterUserScramCredentials_result(event);
                let mut count = 0;
                let responses =
                    rd::rd_kafka_AlterUserScramCredentials_result_responses(result, &mut count);
                (0..count)
                    .map(|i| {
                        error(
                            rd::rd_kafka_AlterUserScramCredentials_result_response_error(
                                *responses.add(i),
                            ),
                        )
                    })
                    .collect()
            },
        );
        all_ok(&format!("creating SCRAM user {name}"), results);
    })
    .await
    .expect("the user request");
}

/// Adds `acls` for `User:<user>`.
pub async fn add(user: &str, acls: &[Acl<'_>]) {
    let principal = CString::new(format!("User:{user}")).unwrap();
    let host = CString::new("*").unwrap();
    let mut errstr = [0 as c_char; 512];
    let mut bindings = Vec::new();
    for acl in acls {
        let (restype, name) = acl.parts();
        // SAFETY: every pointer is a live NUL-terminated string; the
        // binding copies them.
        let binding = unsafe {
            rd::rd_kafka_AclBinding_new(
                restype,
                name.as_ptr(),
                rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
                principal.as_ptr(),
                host.as_ptr(),
                acl.operation.raw(),
                acl.permission.raw(),
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        };
        assert!(!binding.is_null(), "{acl:?}: {}", unsafe {
            text(errstr.as_ptr())
        });
        bindings.push(binding as usize);
    }
    let what = format!("adding {acls:?} for {user}");
    tokio::task::spawn_blocking(move || {
        let mut bindings: Vec<*mut rd::rd_kafka_AclBinding_t> =
            bindings.into_iter().map(|b| b as *mut _).collect();
        let results = request(
            |rk, queue| unsafe {
                rd::rd_kafka_CreateAcls(
                    rk,
                    bindings.as_mut_ptr(),
                    bindings.len(),
                    std::ptr::null(),
                    queue,
                );
                rd::rd_kafka_AclBinding_destroy_array(bindings.as_mut_ptr(), bindings.len());
            },
            |event| unsafe {
                let result = rd::rd_kafka_event_CreateAcls_result(event);
                let mut count = 0;
                let results = rd::rd_kafka_CreateAcls_result_acls(result, &mut count);
                (0..count)
                    .map(|i| error(rd::rd_kafka_acl_result_error(*results.add(i))))
                    .collect()
            },
        );
        all_ok(&what, results);
    })
    .await
    .expect("the ACL request");
}

/// Removes every ACL of `User:<user>` with `permission`.
pub async fn remove(user: &str, permission: Permission) {
    let principal = CString::new(format!("User:{user}")).unwrap();
    let what = format!("removing the {permission:?} ACLs of {user}");
    tokio::task::spawn_blocking(move || {
        let mut errstr = [0 as c_char; 512];
        // SAFETY: as in `add`; null name and host match any.
        let filter = unsafe {
            rd::rd_kafka_AclBindingFilter_new(
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_ANY,
                std::ptr::null(),
                rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_ANY,
                principal.as_ptr(),
                std::ptr::null(),
                rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ANY,
                permission.raw(),
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        };
        assert!(!filter.is_null(), "{}", unsafe { text(errstr.as_ptr()) });
        let mut filters = [filter];
        let results = request(
            |rk, queue| unsafe {
                rd::rd_kafka_DeleteAcls(
                    rk,
                    filters.as_mut_ptr(),
                    filters.len(),
                    std::ptr::null(),
                    queue,
                );
                rd::rd_kafka_AclBinding_destroy_array(filters.as_mut_ptr(), filters.len());
            },
            |event| unsafe {
                let result = rd::rd_kafka_event_DeleteAcls_result(event);
                let mut count = 0;
                let responses = rd::rd_kafka_DeleteAcls_result_responses(result, &mut count);
                (0..count)
                    .map(|i| {
                        error(rd::rd_kafka_DeleteAcls_result_response_error(
                            *responses.add(i),
                        ))
                    })
                    .collect()
            },
        );
        all_ok(&what, results);
    })
    .await
    .expect("the ACL request");
}

/// `base` plus a `[kafka]` section consuming `topic` as `group` through
/// the SASL_SSL listener, logged in as `user` (whose password is the
/// services' SCRAM user's, from its file).
pub fn with_kafka_as(base: &toml::Table, topic: &str, group: &str, user: &str) -> toml::Table {
    let ep = endpoints();
    let mut config = super::kafka::with_kafka(
        base,
        topic,
        group,
        &format!(
            "[client_files]\n\"sasl.password\" = \"{}\"\n",
            ep.get("KAFKA_SASL_PASSWORD_FILE")
        ),
    );
    let section = config["kafka"].as_table_mut().expect("a kafka section");
    section.insert("brokers".into(), ep.get("KAFKA_SASL_BROKERS").into());
    let mut client = ep.kafka_client(&ep.ca());
    client.insert("sasl.username".into(), user.to_string());
    section.insert(
        "client".into(),
        toml::Value::try_from(client).expect("client settings"),
    );
    config
}
