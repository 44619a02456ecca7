//! The current span's W3C trace context, with the `opentelemetry` feature: what `enqueue`
//! writes to `traceparent` when the message carries none.

/// The current span's context as a W3C `traceparent`, when it has a valid one (sampled
/// or not: the flags say which).
#[cfg(feature = "opentelemetry")]
pub fn current_traceparent() -> Option<String> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = std::collections::HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&context, &mut carrier);
    carrier.remove("traceparent")
}

/// Without the `opentelemetry` feature, no span's context is known.
#[cfg(not(feature = "opentelemetry"))]
pub fn current_traceparent() -> Option<String> {
    None
}
