//! W3C trace context (`traceparent`): read from the current span when a message is
//! enqueued, and parsed back when it is sent, so the send span links to the request.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The span context a `traceparent` names, if it is well-formed.
pub fn parse_traceparent(traceparent: &str) -> Option<SpanContext> {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}
