//! The database gauges from a sample: the table's totals as they always were, the lanes'
//! figures added up from the kinds', paused kinds left out, and the pauses themselves.

use std::collections::BTreeMap;
use std::time::SystemTime;

use metrics::{counter, gauge};

use super::{
    CALLBACK_OLDEST_AGE, CALLBACKS_PENDING, CANCELLED, DEAD_LETTERS, KIND_AUTO_PAUSED, KIND_PAUSE_AGE, KIND_PAUSED, LANE_OLDEST_PENDING_AGE,
    LANE_OLDEST_READY_AGE, LANE_READY, LAST_SAMPLE, Metrics, OLDEST_PENDING_AGE, OLDEST_READY_AGE,
    OLDEST_TRANSACTION_AGE, PENDING, TABLE_DEAD_TUPLES, unix_seconds,
};
use crate::lock::lock;
use crate::message::Lane;
use crate::store::Sample;

/// One lane's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct LaneFigures {
    ready: i64,
    oldest_ready_age: f64,
    oldest_pending_age: f64,
}

impl Metrics {
    /// Sets every database gauge from `sample`.
    pub fn sample(&self, sample: &Sample) {
        let totals = &sample.totals;
        gauge!(PENDING).set(totals.pending as f64);
        gauge!(DEAD_LETTERS).set(totals.dead_letters as f64);
        gauge!(OLDEST_PENDING_AGE).set(totals.oldest_pending_age);
        gauge!(OLDEST_READY_AGE).set(totals.oldest_ready_age);
        gauge!(OLDEST_TRANSACTION_AGE).set(totals.oldest_transaction_age);
        gauge!(TABLE_DEAD_TUPLES).set(totals.dead_tuples as f64);
        for (lane, figures) in self.lane_figures(sample) {
            gauge!(LANE_READY, "lane" => lane.as_str()).set(figures.ready as f64);
            gauge!(LANE_OLDEST_READY_AGE, "lane" => lane.as_str()).set(figures.oldest_ready_age);
            gauge!(LANE_OLDEST_PENDING_AGE, "lane" => lane.as_str())
                .set(figures.oldest_pending_age);
        }
        self.record_pauses(sample);
        counter!(CANCELLED).increment(u64::try_from(sample.events.cancelled).unwrap_or(0));
        gauge!(CALLBACKS_PENDING).set(sample.callbacks.pending as f64);
        gauge!(CALLBACK_OLDEST_AGE).set(sample.callbacks.oldest_age);
        gauge!(LAST_SAMPLE).set(unix_seconds(SystemTime::now()));
    }

    /// Each lane's figures, from the kinds that are not paused.
    fn lane_figures(&self, sample: &Sample) -> BTreeMap<Lane, LaneFigures> {
        let mut lanes: BTreeMap<Lane, LaneFigures> = Lane::ALL
            .into_iter()
            .map(|l| (l, LaneFigures::default()))
            .collect();
        let paused = |kind: &str| sample.paused.iter().any(|p| p.kind == kind);
        for kind in sample.kinds.iter().filter(|k| !paused(&k.kind)) {
            let figures = lanes.entry(self.lanes.of(&kind.kind)).or_default();
            figures.ready += kind.ready;
            figures.oldest_ready_age = figures.oldest_ready_age.max(kind.oldest_ready_age);
            figures.oldest_pending_age = figures.oldest_pending_age.max(kind.oldest_pending_age);
        }
        lanes
    }

    /// `outbox_kind_paused` and its age for every kind label that is or was paused, and
    /// at 0 for the kinds with templates.
    fn record_pauses(&self, sample: &Sample) {
        // Per label: the pause's age (-1: not paused), and whether outboxd paused it.
        let mut paused: BTreeMap<String, (f64, bool)> = self
            .kinds
            .iter()
            .map(|k| (k.clone(), (-1.0, false)))
            .collect();
        for label in lock(&self.paused_labels).iter() {
            paused.insert(label.clone(), (-1.0, false));
        }
        for pause in &sample.paused {
            let (age, automatic) = paused
                .entry(self.kind_label(&pause.kind))
                .or_insert((-1.0, false));
            *age = age.max(pause.paused_for.max(0.0));
            *automatic |= pause.automatic;
        }
        let flag = |on: bool| if on { 1.0 } else { 0.0 };
        let mut labels = lock(&self.paused_labels);
        for (label, (age, automatic)) in paused {
            let is_paused = age >= 0.0;
            gauge!(KIND_PAUSED, "kind" => label.clone()).set(flag(is_paused));
            gauge!(KIND_AUTO_PAUSED, "kind" => label.clone()).set(flag(automatic));
            gauge!(KIND_PAUSE_AGE, "kind" => label.clone()).set(age.max(0.0));
            if is_paused {
                labels.insert(label);
            }
        }
    }
}
