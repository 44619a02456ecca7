//! The same metrics over OTLP: a `metrics` recorder that hands every counter, gauge and
//! histogram to an OpenTelemetry meter, installed beside the Prometheus recorder (a fan-out)
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. One set of `counter!`/`gauge!`/`histogram!`
//! calls feeds both, so the names, labels, units and buckets cannot drift apart.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_util::registry::{Registry, Storage};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{InstrumentBuilder, Meter};

/// A `metrics` recorder writing to an OpenTelemetry meter. Handles are kept per key, as the
/// Prometheus recorder keeps them, so a `counter!` call costs a lookup, not a new instrument.
pub struct OtelRecorder {
    registry: Registry<Key, Instruments>,
}

impl OtelRecorder {
    /// `buckets`: the explicit bucket boundaries of each histogram that has them, by name
    /// (the Prometheus recorder is given the same).
    pub fn new(meter: Meter, buckets: &[(&str, &[f64])]) -> Self {
        let instruments = Instruments {
            meter,
            described: Mutex::new(HashMap::new()),
            buckets: buckets
                .iter()
                .map(|(name, bounds)| ((*name).to_owned(), bounds.to_vec()))
                .collect(),
        };
        Self {
            registry: Registry::new(instruments),
        }
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        let described = &self.registry.storage().described;
        let mut described = described.lock().unwrap_or_else(PoisonError::into_inner);
        described.insert(
            key.as_str().to_owned(),
            Described {
                unit,
                help: description.into_owned(),
            },
        );
    }
}

impl Recorder for OtelRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.describe(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.describe(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.describe(key, unit, description);
    }

    fn register_counter(&self, key: &Key, _metadata: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _metadata: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _metadata: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// Makes the OpenTelemetry instrument behind each new key. The SDK returns the same
/// instrument for the same name, so every key of a metric shares one.
struct Instruments {
    meter: Meter,
    /// Units and help texts by metric name, from `describe_*` (all made at start-up).
    described: Mutex<HashMap<String, Described>>,
    buckets: HashMap<String, Vec<f64>>,
}

impl Instruments {
    /// The metric's unit in UCUM, as OTLP carries it, and its help text.
    fn described(&self, name: &str) -> (Option<&'static str>, String) {
        let described = self
            .described
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match described.get(name) {
            Some(d) => (d.unit.map(ucum), d.help.clone()),
            None => (None, String::new()),
        }
    }
}

impl Instruments {
    /// `builder` with the help text and unit `describe_*` gave `key`'s metric.
    fn with_description<'a, T>(
        &self,
        key: &Key,
        builder: InstrumentBuilder<'a, T>,
    ) -> InstrumentBuilder<'a, T> {
        let (unit, help) = self.described(key.name());
        let builder = builder.with_description(help);
        match unit {
            Some(unit) => builder.with_unit(unit),
            None => builder,
        }
    }
}

/// A metric's unit and help text, as `describe_*` gave them.
struct Described {
    unit: Option<Unit>,
    help: String,
}

/// `metrics`' units in UCUM (what OTLP's `unit` holds); only seconds are used here.
fn ucum(unit: Unit) -> &'static str {
    match unit {
        Unit::Seconds => "s",
        Unit::Milliseconds => "ms",
        Unit::Microseconds => "us",
        Unit::Nanoseconds => "ns",
        Unit::Bytes => "By",
        Unit::Percent => "%",
        _ => "1",
    }
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|label| KeyValue::new(label.key().to_owned(), label.value().to_owned()))
        .collect()
}

impl Storage<Key> for Instruments {
    type Counter = Arc<OtelCounter>;
    type Gauge = Arc<OtelGauge>;
    type Histogram = Arc<OtelHistogram>;

    fn counter(&self, key: &Key) -> Self::Counter {
        let builder = self.meter.u64_counter(key.name().to_owned());
        Arc::new(OtelCounter {
            instrument: self.with_description(key, builder).build(),
            attributes: attributes(key),
            total: AtomicU64::new(0),
        })
    }

    fn gauge(&self, key: &Key) -> Self::Gauge {
        let builder = self.meter.f64_gauge(key.name().to_owned());
        Arc::new(OtelGauge {
            instrument: self.with_description(key, builder).build(),
            attributes: attributes(key),
            value: Mutex::new(0.0),
        })
    }

    fn histogram(&self, key: &Key) -> Self::Histogram {
        let name = key.name().to_owned();
        let (unit, help) = self.described(&name);
        let buckets = self.buckets.get(&name).cloned();
        let mut builder = self.meter.f64_histogram(name).with_description(help);
        if let Some(unit) = unit {
            builder = builder.with_unit(unit);
        }
        if let Some(buckets) = buckets {
            builder = builder.with_boundaries(buckets);
        }
        Arc::new(OtelHistogram {
            instrument: builder.build(),
            attributes: attributes(key),
        })
    }
}

/// A monotonic counter. OTLP takes increments; `absolute` (a total read from elsewhere)
/// is turned into the increment since the last total.
pub struct OtelCounter {
    instrument: opentelemetry::metrics::Counter<u64>,
    attributes: Vec<KeyValue>,
    total: AtomicU64,
}

impl CounterFn for OtelCounter {
    fn increment(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
        self.instrument.add(value, &self.attributes);
    }

    fn absolute(&self, value: u64) {
        let before = self.total.fetch_max(value, Ordering::Relaxed);
        if value > before {
            self.instrument.add(value - before, &self.attributes);
        }
    }
}

/// A gauge. OTLP's gauge records values; `increment` and `decrement` keep the current one.
pub struct OtelGauge {
    instrument: opentelemetry::metrics::Gauge<f64>,
    attributes: Vec<KeyValue>,
    /// The current value, held while it is recorded: two changes at once are recorded in
    /// the order they were made, so the last one recorded is the value.
    value: Mutex<f64>,
}

impl OtelGauge {
    fn update(&self, change: impl Fn(f64) -> f64) {
        let mut value = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        *value = change(*value);
        self.instrument.record(*value, &self.attributes);
    }
}

impl GaugeFn for OtelGauge {
    fn increment(&self, value: f64) {
        self.update(|now| now + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|now| now - value);
    }

    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

/// A histogram with the same bucket boundaries as the Prometheus one.
pub struct OtelHistogram {
    instrument: opentelemetry::metrics::Histogram<f64>,
    attributes: Vec<KeyValue>,
}

impl HistogramFn for OtelHistogram {
    fn record(&self, value: f64) {
        self.instrument.record(value, &self.attributes);
    }
}
