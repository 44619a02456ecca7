//! The token bucket that all replicas draw from before they claim, so that a send-rate
//! limit holds for the table, not per process.

use sqlx::{FromRow, PgPool};

/// One draw from a bucket.
#[derive(Debug, Clone, Copy)]
pub struct TokenRequest<'a> {
    pub bucket: &'a str,
    /// The configured limit, in messages per second: the most the pace recovers to.
    pub limit: f64,
    /// The most tokens to take (the batch size).
    pub wanted: i64,
    /// The bucket holds at most this many seconds of the pace (at least one token).
    pub burst_seconds: f64,
    /// How much of the limit the pace recovers per second after throttling.
    pub recovery_per_second: f64,
}

/// What a draw got.
#[derive(Debug, Clone, Copy, PartialEq, FromRow)]
pub struct Grant {
    pub granted: i64,
    /// Tokens left after the draw (less than one when nothing was granted).
    pub left: f64,
    /// The pace now, in messages per second.
    pub pace: f64,
}

/// Refills the bucket for the time since its last draw, then takes up to `wanted` whole
/// tokens. One statement; the row lock serializes replicas for its duration only.
pub async fn take(pool: &PgPool, request: &TokenRequest<'_>) -> Result<Grant, sqlx::Error> {
    loop {
        let grant: Option<Grant> = sqlx::query_as(
            "WITH current AS ( \
                 SELECT name, tokens, pace, \
                        greatest(0, extract(epoch FROM clock_timestamp() - updated_at))::float8 AS elapsed \
                 FROM outbox_send_rate WHERE name = $1 FOR UPDATE \
             ), recovered AS ( \
                 SELECT name, tokens, elapsed, least($2, pace + $2 * $5 * elapsed) AS pace FROM current \
             ), available AS ( \
                 SELECT name, pace, least(greatest(1, pace * $4), tokens + pace * elapsed) AS tokens \
                 FROM recovered \
             ) \
             UPDATE outbox_send_rate AS b \
             SET tokens = a.tokens - least($3, floor(a.tokens)), pace = a.pace, \
                 updated_at = clock_timestamp() \
             FROM available AS a WHERE b.name = a.name \
             RETURNING least($3, floor(a.tokens))::int8 AS granted, \
                       (a.tokens - least($3, floor(a.tokens)))::float8 AS left, a.pace::float8 AS pace",
        )
        .bind(request.bucket)
        .bind(request.limit)
        .bind(request.wanted)
        .bind(request.burst_seconds)
        .bind(request.recovery_per_second)
        .fetch_optional(pool)
        .await?;
        if let Some(grant) = grant {
            return Ok(grant);
        }
        // The first draw on this table: an empty bucket at the full pace.
        sqlx::query(
            "INSERT INTO outbox_send_rate (name, tokens, pace) VALUES ($1, 0, $2) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(request.bucket)
        .bind(request.limit)
        .execute(pool)
        .await?;
    }
}

/// Returns tokens a claim took but found no rows for.
pub async fn give_back(pool: &PgPool, bucket: &str, tokens: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE outbox_send_rate SET tokens = tokens + $2 WHERE name = $1")
        .bind(bucket)
        .bind(tokens as f64)
        .execute(pool)
        .await?;
    Ok(())
}

/// The relay said it is throttling: halve the pace, at most once a second (one burst of
/// throttled replies is one signal), never below `min_pace`.
pub async fn slow_down(pool: &PgPool, bucket: &str, min_pace: f64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE outbox_send_rate \
         SET pace = greatest($2, pace / 2), throttled_at = clock_timestamp() \
         WHERE name = $1 \
           AND (throttled_at IS NULL OR throttled_at < clock_timestamp() - interval '1 second')",
    )
    .bind(bucket)
    .bind(min_pace)
    .execute(pool)
    .await?;
    Ok(())
}
