//! Observability: logs, OpenTelemetry trace export, and Prometheus metrics. The
//! `traceparent` helpers live in [`crate::trace_context`], below the store that uses them.

mod labels;
pub mod metrics;
mod panics;

pub use panics::{PANIC_TARGET, PanicContext, catch_panic, log_panics};

use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Flushes exported spans when dropped; keep it alive until the process ends.
#[must_use = "spans are flushed when the guard is dropped"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: could not flush traces: {e}");
        }
    }
}

/// Whether spans leave the process (an OTLP exporter is set up). Per-message spans are
/// built only then: the log lines name the message themselves.
static SPANS_EXPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether per-message spans are worth building: an OTLP exporter is set up.
pub fn spans_exported() -> bool {
    SPANS_EXPORTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Logs to stderr (`RUST_LOG`, default `info`), and spans over OTLP when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set: HTTP/protobuf, or gRPC
/// with `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`. The SDK reads the other standard `OTEL_*`
/// variables itself. Must be called inside a Tokio runtime (gRPC needs one).
pub fn init(format: LogFormat) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx::postgres::notice=warn"));
    let (provider, otel_error) = match tracer_provider() {
        Ok(provider) => (provider, None),
        Err(e) => (None, Some(e)),
    };
    let otel_layer = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("outboxd")));
    // Colours only on a terminal: a pipe or a file (a container's log, a journal) would
    // keep the escape codes. `NO_COLOR` turns them off on a terminal too.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let installed = match format {
        LogFormat::Text => registry.with(fmt).try_init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).try_init(),
    };
    if let Err(e) = installed {
        eprintln!("warning: logging was already set up: {e}");
    }
    SPANS_EXPORTED.store(provider.is_some(), std::sync::atomic::Ordering::Relaxed);
    if let Some(e) = otel_error {
        tracing::warn!(error = %e, "OpenTelemetry export is off: the exporter could not be built");
    } else if provider.is_some() {
        tracing::info!("exporting traces over OTLP");
    }
    TelemetryGuard { provider }
}

fn tracer_provider() -> anyhow::Result<Option<SdkTracerProvider>> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Ok(None);
    }
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    let exporter = match protocol.trim() {
        "grpc" => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?,
        "" | "http/protobuf" => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()?,
        other => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported: use grpc or http/protobuf"
        ),
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("outboxd");
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    ))
}
