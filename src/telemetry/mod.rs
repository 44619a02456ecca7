//! Observability: logs, OpenTelemetry trace export, and Prometheus metrics. The
//! `traceparent` helpers live in [`crate::trace_context`], below the store that uses them.

mod labels;
pub mod metrics;
mod panics;

pub use panics::{PanicContext, catch_panic, log_panics};

use std::io::IsTerminal as _;

use std::sync::OnceLock;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
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

/// Flushes exported spans and metrics when dropped; keep it alive until the process ends.
#[must_use = "spans and metrics are flushed when the guard is dropped"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    meters: Option<SdkMeterProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: could not flush traces: {e}");
        }
        if let Some(meters) = self.meters.take()
            && let Err(e) = meters.shutdown()
        {
            eprintln!("warning: could not flush metrics: {e}");
        }
    }
}

/// The meter the metrics are also exported to over OTLP, once [`init`] has set one up.
static OTLP_METER: OnceLock<Meter> = OnceLock::new();

/// The OTLP meter, when metrics are exported over OTLP: [`metrics::install_recorder`]
/// then feeds it beside Prometheus.
pub(crate) fn otlp_meter() -> Option<Meter> {
    OTLP_METER.get().cloned()
}

/// Whether spans leave the process (an OTLP exporter is set up). Per-message spans are
/// built only then: the log lines name the message themselves.
static SPANS_EXPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether per-message spans are worth building: an OTLP exporter is set up.
pub fn spans_exported() -> bool {
    SPANS_EXPORTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Logs to stderr (`RUST_LOG`, default `info`); spans over OTLP when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, and metrics when it (or
/// `..._METRICS_ENDPOINT`) is: HTTP/protobuf, or gRPC with `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`.
/// The SDK reads the other standard `OTEL_*` variables itself (`OTEL_METRIC_EXPORT_INTERVAL`
/// among them). Must be called inside a Tokio runtime (gRPC needs one).
pub fn init(format: LogFormat) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx::postgres::notice=warn"));
    let (provider, otel_error) = match tracer_provider() {
        Ok(provider) => (provider, None),
        Err(e) => (None, Some(e)),
    };
    let (meters, meters_error) = match meter_provider() {
        Ok(meters) => (meters, None),
        Err(e) => (None, Some(e)),
    };
    if let Some(meters) = &meters {
        // Set once per process: a second init (there is none) would keep the first meter.
        let _ = OTLP_METER.set(meters.meter("outboxd"));
    }
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
    if let Some(e) = meters_error {
        tracing::warn!(error = %e, "OTLP metrics are off: the exporter could not be built");
    } else if meters.is_some() {
        tracing::info!("exporting metrics over OTLP");
    }
    TelemetryGuard { provider, meters }
}

fn variable_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

/// Whether a signal (`TRACES`, `METRICS`) is exported: an endpoint is set for it or for all,
/// and `OTEL_{signal}_EXPORTER` is not `none` (the standard way to keep one signal home).
fn exported(signal: &str) -> bool {
    let off = std::env::var(format!("OTEL_{signal}_EXPORTER"))
        .is_ok_and(|exporter| exporter.trim().eq_ignore_ascii_case("none"));
    !off && (variable_set("OTEL_EXPORTER_OTLP_ENDPOINT")
        || variable_set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")))
}

/// HTTP's encoding: protobuf, the default (`http/protobuf`).
const HTTP: Protocol = Protocol::HttpBinary;

/// The signal's OTLP transport: gRPC, or HTTP/protobuf (the default).
#[derive(Clone, Copy)]
enum Transport {
    Grpc,
    HttpProtobuf,
}

/// The transport `signal` is exported over, or `None` when it is not exported.
fn transport(signal: &str) -> anyhow::Result<Option<Transport>> {
    if !exported(signal) {
        return Ok(None);
    }
    let protocol = std::env::var(format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"))
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    match protocol.trim() {
        "grpc" => Ok(Some(Transport::Grpc)),
        "" | "http/protobuf" => Ok(Some(Transport::HttpProtobuf)),
        other => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported: use grpc or http/protobuf"
        ),
    }
}

/// `service.name` is outboxd unless `OTEL_SERVICE_NAME` says otherwise (the SDK reads it).
fn resource() -> opentelemetry_sdk::Resource {
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !variable_set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("outboxd");
    }
    resource.build()
}

fn tracer_provider() -> anyhow::Result<Option<SdkTracerProvider>> {
    let Some(transport) = transport("TRACES")? else {
        return Ok(None);
    };
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match transport {
        Transport::Grpc => builder.with_tonic().build()?,
        Transport::HttpProtobuf => builder.with_http().with_protocol(HTTP).build()?,
    };
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build(),
    ))
}

/// The metrics' OTLP export: cumulative, as Prometheus counts, every
/// `OTEL_METRIC_EXPORT_INTERVAL` (60 s by default; the SDK reads it).
fn meter_provider() -> anyhow::Result<Option<SdkMeterProvider>> {
    let Some(transport) = transport("METRICS")? else {
        return Ok(None);
    };
    let builder = opentelemetry_otlp::MetricExporter::builder();
    let exporter = match transport {
        Transport::Grpc => builder.with_tonic().build()?,
        Transport::HttpProtobuf => builder.with_http().with_protocol(HTTP).build()?,
    };
    Ok(Some(
        SdkMeterProvider::builder()
            .with_periodic_exporter(exporter)
            .with_resource(resource())
            .build(),
    ))
}
