//! The OTLP exporter behind `[telemetry]`: gRPC or HTTP/protobuf, a
//! parent-based ratio sampler, and a batch processor on a thread of its own
//! (spans are queued, never exported on the message's path).

use crate::config::{OtlpProtocol, TelemetrySettings};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig};
use opentelemetry_otlp::{
    Protocol, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use std::time::Duration;

/// Why the exporter could not be built; start-up stops naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The OTLP exporter could not be built for `telemetry.endpoint`.
    #[error("invalid setting `telemetry.endpoint`: the OTLP exporter refused it")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
    /// The HTTP client for OTLP/HTTP could not be built.
    #[error(
        "the HTTP client for OTLP export (`telemetry.protocol = \"http\"`) could not be built"
    )]
    Client(#[source] reqwest::Error),
    /// OTLP/HTTP was set up outside a Tokio runtime, which its exports run
    /// on.
    #[error("`[telemetry]` needs a Tokio runtime to export from")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    /// `telemetry.ca_file` cannot be used.
    #[error(transparent)]
    Ca(#[from] crate::config::ConfigError),
    /// `telemetry.ca_file` was read but is not a certificate the TLS client
    /// takes.
    #[error("invalid setting `telemetry.ca_file`: not a PEM certificate the TLS client accepts")]
    CaRefused(#[source] reqwest::Error),
}

pub(super) fn tracer_provider(s: &TelemetrySettings) -> Result<SdkTracerProvider, ExportError> {
    let ca = s.ca_pem()?;
    let exporter = match s.protocol {
        OtlpProtocol::Grpc => {
            let builder = SpanExporter::builder()
                .with_tonic()
                .with_endpoint(&s.endpoint)
                .with_timeout(s.export_timeout);
            if is_https(&s.endpoint) {
                // The public roots, and the configured CA besides them.
                let tls = ClientTlsConfig::new().with_webpki_roots();
                let tls = match &ca {
                    Some(pem) => tls.ca_certificate(Certificate::from_pem(pem)),
                    None => tls,
                };
                builder.with_tls_config(tls).build()
            } else {
                builder.build()
            }
        }
        OtlpProtocol::Http => SpanExporter::builder()
            .with_http()
            .with_http_client(RuntimeClient::new(s.export_timeout, ca.as_deref())?)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(traces_url(&s.endpoint))
            .with_timeout(s.export_timeout)
            .build(),
    }
    .map_err(ExportError::Exporter)?;
    let configured = s
        .resource_attributes
        .iter()
        .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone()));
    let resource = Resource::builder()
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_attributes(configured)
        .with_service_name(s.service_name.clone())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // A producer's decision wins: its sampled traces are continued
        // whole, its unsampled ones not started again here.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            s.sampling_ratio,
        ))))
        .with_resource(resource)
        .build())
}

/// Whether the collector is reached over TLS (the scheme in any case, as
/// the gRPC client reads it).
fn is_https(endpoint: &str) -> bool {
    url::Url::parse(endpoint).is_ok_and(|u| u.scheme() == "https")
}

/// OTLP/HTTP's path for traces under the collector's base URL.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// The exporter's HTTP client: dedupq's reqwest, run on the process's
/// Tokio runtime. The SDK's batch processor drives exports from a thread
/// without a runtime, where an async client could not make progress.
#[derive(Debug)]
struct RuntimeClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl RuntimeClient {
    fn new(timeout: Duration, ca: Option<&str>) -> Result<Self, ExportError> {
        let mut builder = reqwest::Client::builder().timeout(timeout);
        if let Some(pem) = ca {
            let ca =
                reqwest::Certificate::from_pem(pem.as_bytes()).map_err(ExportError::CaRefused)?;
            builder = builder.add_root_certificate(ca);
        }
        Ok(Self {
            client: builder.build().map_err(ExportError::Client)?,
            runtime: tokio::runtime::Handle::try_current().map_err(ExportError::NoRuntime)?,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let (status, headers, body) = self
            .runtime
            .spawn(async move {
                let response = client.execute(request).await?;
                let (status, headers) = (response.status(), response.headers().clone());
                Ok::<_, reqwest::Error>((status, headers, response.bytes().await?))
            })
            .await??;
        let mut response = Response::builder().status(status).body(body)?;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::{is_https, traces_url};

    #[test]
    fn an_https_scheme_in_any_case_means_tls() {
        assert!(is_https("https://collector:4317"));
        assert!(is_https("HTTPS://collector:4317"));
        assert!(!is_https("http://collector:4317"));
    }

    #[test]
    fn the_http_endpoint_is_a_base_url_under_which_traces_go_to_v1_traces() {
        assert_eq!(
            traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://collector/otlp/"),
            "https://collector/otlp/v1/traces"
        );
    }
}
