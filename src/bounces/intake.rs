//! What a message the bounce listener took comes to. Its recipient must be a return path
//! outboxd made (else it is forged, whoever sent it); its body must be a DSN (else it is an
//! auto-reply or a human's answer); each recipient the DSN reports as failed for good is a
//! hard bounce of the message the return path names, recorded as the webhooks' bounces are,
//! once (a DSN sent again is a replay), and only for a recipient that message was sent to.

use std::sync::Arc;

use ring::digest;

use super::dsn::{self, RecipientStatus};
use crate::feedback::{Event, EventKind, RowNames};
use crate::message::{Lanes, MessageIds, ReturnPaths};
use crate::store::{self, Store};
use crate::suppression::{Address, BounceType, FeedbackSource};
use crate::telemetry::metrics::{DsnResult, Metrics};
use crate::text::mask_addresses;

/// The longest diagnostic kept on a timeline.
const MAX_DETAIL_CHARS: usize = 300;

/// Reads and records what comes back to the return paths.
pub struct Intake {
    store: Store,
    paths: Arc<ReturnPaths>,
    message_ids: MessageIds,
    lanes: Lanes,
    metrics: Arc<Metrics>,
}

impl Intake {
    pub fn new(
        store: Store,
        paths: Arc<ReturnPaths>,
        message_ids: MessageIds,
        lanes: Lanes,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            paths,
            message_ids,
            lanes,
            metrics,
        }
    }

    /// Whether mail for `address` is taken at all: the bounce domain's only (no open relay).
    pub fn takes_mail_for(&self, address: &str) -> bool {
        address
            .rsplit_once('@')
            .is_some_and(|(_, domain)| domain.eq_ignore_ascii_case(self.paths.domain()))
    }

    pub fn domain(&self) -> &str {
        self.paths.domain()
    }

    /// Counts a message refused for its size.
    pub fn too_large(&self) {
        self.metrics.bounce_listener(DsnResult::TooLarge);
    }

    /// Counts a message that could not be recorded now.
    pub fn failed(&self) {
        self.metrics.bounce_listener(DsnResult::Failed);
    }

    /// Reads and records one message sent to `recipients`; an error is the database's,
    /// and the sender is asked to send it again.
    pub async fn take(&self, recipients: &[String], raw: &[u8]) -> Result<DsnResult, sqlx::Error> {
        let rows: Vec<i64> = recipients
            .iter()
            .filter_map(|to| self.paths.read(to).ok())
            .collect();
        let result = match (rows.as_slice(), dsn::read(raw)) {
            ([], _) => Ok(DsnResult::Forged),
            (_, Err(e)) => {
                tracing::info!(reason = %e, "bounce listener: not a bounce; nothing recorded");
                Ok(DsnResult::NotABounce)
            }
            (rows, Ok(statuses)) => self.record(rows, &statuses, raw).await,
        };
        if let Ok(result) = result {
            self.metrics.bounce_listener(result);
        }
        result
    }

    async fn record(&self, rows: &[i64], statuses: &[RecipientStatus], raw: &[u8]) -> Result<DsnResult, sqlx::Error> {
        let events: Vec<Event> = rows
            .iter()
            .flat_map(|row| statuses.iter().filter_map(move |status| event(*row, status)))
            .collect();
        if events.is_empty() {
            return Ok(DsnResult::NotABounce);
        }
        let reports: Vec<_> = events
            .iter()
            .map(|event| event.feedback(FeedbackSource::Dsn, &self.message_ids))
            .collect();
        // The same DSN delivered twice (after a 451, or by a relay that retries) is one.
        let id = crate::text::hex(digest::digest(&digest::SHA256, raw).as_ref());
        let recorded = store::suppressions::record_feedback(
            &self.store,
            FeedbackSource::Dsn,
            Some(&id),
            &reports,
            &self.lanes,
        )
        .await?;
        if recorded.replay {
            return Ok(DsnResult::Replay);
        }
        if recorded.suppressed + recorded.already_suppressed + recorded.marked == 0 {
            // It names our message, but none of its recipients (or a row retention removed).
            tracing::info!(rows = ?rows, "bounce listener: a DSN about an address its message was not sent to; nothing recorded");
            return Ok(DsnResult::Forged);
        }
        for event in &events {
            if let EventKind::Bounce(bounce_type) = event.kind {
                self.metrics.bounce(FeedbackSource::Dsn, bounce_type);
            }
        }
        tracing::info!(
            rows = ?rows,
            suppressed = recorded.suppressed,
            marked = recorded.marked,
            not_marked = recorded.not_marked,
            "bounce listener: a DSN recorded"
        );
        Ok(DsnResult::Recorded)
    }
}

/// A recipient's bounce of message `row`: hard for a failure for good that says the mailbox
/// does not exist (it suppresses), undetermined for another failure for good (the sender's
/// reputation, DMARC, the size: the row is marked, the address kept), soft for a delay or a
/// 4.x.x; nothing for a delivery, or an address that does not parse.
fn event(row: i64, status: &RecipientStatus) -> Option<Event> {
    let bounce_type = if status.says_mailbox_unknown() {
        BounceType::Hard
    } else if status.is_hard() {
        BounceType::Undetermined
    } else if status.is_soft() {
        BounceType::Soft
    } else {
        return None;
    };
    let address = Address::parse(&status.recipient).ok()?;
    let said = match &status.diagnostic {
        Some(diagnostic) => format!("{} {diagnostic}", status.status),
        None => status.status.clone(),
    };
    Some(Event {
        kind: EventKind::Bounce(bounce_type),
        address,
        row: RowNames {
            message_id: None,
            outbox_id: Some(row),
        },
        detail: Some(crate::text::storable(&mask_addresses(&said), MAX_DETAIL_CHARS)),
    })
}

