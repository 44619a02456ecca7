//! Each kind's secret fields and payload retention (`sql/kind_policies.sql`): published at
//! start from the kinds' `kind.toml`, so that every statement that ends or shows a message
//! masks the same fields, whichever program runs it; and payload retention's sweep.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::statement::Sql;
use super::statements::Store;
use crate::message::{Kind, SecretField};

/// What one kind declares about its payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindPolicy {
    pub kind: Kind,
    pub secret_fields: Vec<SecretField>,
    /// How long after its message ends a payload is kept, when less than its row.
    pub payload_retention: Option<Duration>,
}

/// Makes `outbox_kind_policies` say what `policies` say, writing only when they differ: a
/// role without the right to write the table starts whenever its kinds agree with it.
pub async fn publish(store: &Store, policies: &[KindPolicy]) -> Result<(), sqlx::Error> {
    if agrees(&published(store).await?, policies) {
        return Ok(());
    }
    let kinds: Vec<&str> = policies.iter().map(|p| p.kind.as_str()).collect();
    let fields: Vec<String> = policies
        .iter()
        .map(|p| {
            let names: Vec<&str> = p.secret_fields.iter().map(SecretField::as_str).collect();
            names.join(",")
        })
        .collect();
    let retentions: Vec<Option<f64>> = policies
        .iter()
        .map(|p| p.payload_retention.map(|d| d.as_secs_f64()))
        .collect();
    let query = store
        .query(Sql::PublishKindPolicies)
        .bind(kinds)
        .bind(fields)
        .bind(retentions);
    store.execute(query).await.map(drop)
}

/// Whether the table says what `policies` say (both in kind order).
fn agrees(table: &[PublishedPolicy], policies: &[KindPolicy]) -> bool {
    table.len() == policies.len()
        && table.iter().zip(policies).all(|(row, policy)| {
            let fields: Vec<&str> = policy.secret_fields.iter().map(SecretField::as_str).collect();
            row.kind == policy.kind.as_str()
                && row.secret_fields == fields
                && row.payload_retention == policy.payload_retention.map(|d| d.as_secs_f64())
        })
}

/// A kind's policy as the table holds it, and how far its payload sweep has gone.
#[derive(Debug, Clone, FromRow)]
pub struct PublishedPolicy {
    pub kind: String,
    pub secret_fields: Vec<String>,
    /// Seconds; `None`: the payload is kept as long as the row.
    pub payload_retention: Option<f64>,
    pub payload_swept_until: Option<DateTime<Utc>>,
}

/// The policies the table holds now.
pub async fn published(store: &Store) -> Result<Vec<PublishedPolicy>, sqlx::Error> {
    store.all(store.query_as(Sql::KindPolicies)).await
}

/// Which ended messages a sweep walks: by the column that says when they ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Sent,
    /// Ended unsent for good (expired, suppressed, cancelled, a dead letter discarded). A
    /// dead letter waiting for an operator keeps its payload: it may be retried.
    Discarded,
}

/// One statement's walk.
#[derive(Debug, Clone, Copy, FromRow)]
pub struct Walked {
    pub last_at: Option<DateTime<Utc>>,
    pub last_id: Option<i64>,
    pub scanned: i64,
    /// The kind's rows walked whose payload was still there.
    pub due: i64,
    pub removed: i64,
}

/// Removes the payloads of `kind`'s messages that ended before `cutoff`, walking at most
/// `limit` ended messages after `after` (from `from`, where the last pass stopped).
pub async fn remove_payloads(
    store: &Store,
    ended: Ended,
    kind: &str,
    from: Option<DateTime<Utc>>,
    cutoff: DateTime<Utc>,
    after: Option<(DateTime<Utc>, i64)>,
    limit: i64,
) -> Result<Walked, sqlx::Error> {
    let sql = match ended {
        Ended::Sent => Sql::RemoveSentPayloads,
        Ended::Discarded => Sql::RemoveDiscardedPayloads,
    };
    let query = store
        .query_as(sql)
        .bind(kind)
        .bind(from)
        .bind(cutoff)
        .bind(after.map(|(at, _)| at))
        .bind(after.map_or(0, |(_, id)| id))
        .bind(limit);
    store.one(query).await
}

/// Records that `kind`'s sweep is done up to `cutoff`.
pub async fn swept(store: &Store, kind: &str, cutoff: DateTime<Utc>) -> Result<(), sqlx::Error> {
    let query = store.query(Sql::PayloadsSwept).bind(kind).bind(cutoff);
    store.execute(query).await.map(drop)
}
