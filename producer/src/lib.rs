//! Enqueue emails for [outboxd](https://github.com/outboxd/outboxd) from a Rust application,
//! in the application's own sqlx transaction: the email is committed, or rolled back, with
//! the business change that caused it. outboxd, running beside the application, sends it.
//!
//! This crate is only the producer's side: [`NewMessage`], checked as it is built, and one
//! `INSERT`.
//! It does not pull in outboxd's HTTP, SMTP or telemetry stacks, nor choose sqlx's runtime
//! or TLS: the application's own sqlx does.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! // ... the business change, in `tx` ...
//! let email = outboxd_producer::NewMessage::new(
//!     "account_verification",
//!     serde_json::json!({"to": "ada@example.com", "name": "Ada", "verify_url": "https://app.example/v/1"}),
//! )?;
//! outboxd_producer::enqueue(&mut *tx, email).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Where outboxd's tables are in a schema of their own (`OUTBOXD_SCHEMA`), or the
//! application reaches PostgreSQL through a transaction pooler, hold an [`Outbox`] that
//! says so and enqueue with it.

mod message;
pub mod schema;
pub mod template;
mod trace;

pub use message::{
    InvalidMessage, Kind, MAX_IDEMPOTENCY_KEY_CHARS, MAX_KIND_CHARS, MAX_PRIORITY, MAX_TAG_CHARS,
    MAX_TAGS, MAX_TRACEPARENT_CHARS, NewMessage, TIME_RANGE_SECS, Tag,
};
pub use schema::{InvalidSchema, Schema};
pub use trace::current_traceparent;

use std::sync::Arc;

use sqlx::PgExecutor;

/// Why a message was not enqueued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The message could not be built: [`NewMessage`]'s checks, for `?` in a function that
    /// builds and enqueues. Nothing was sent.
    #[error(transparent)]
    Invalid(#[from] InvalidMessage),
    /// The insert failed (the caller's transaction is then aborted, as after any error).
    #[error("could not insert the outbox row: {0}")]
    Database(#[from] sqlx::Error),
    /// Another transaction committed the same idempotency key while this one waited for
    /// it: enqueue again to get that message's id.
    #[error(
        "another transaction enqueued the same idempotency key at the same moment; retry to get its id"
    )]
    KeyInFlight,
}

/// The insert (`sql/enqueue.sql`), as a template: `{{schema}}` marks outboxd's table.
const INSERT: &str = include_str!("sql/enqueue.sql");

/// The insert's text in `schema`. The file has no marker but `{{schema}}`, which always
/// renders (`the_insert_renders_in_a_schema_and_without_one`).
fn insert_in(schema: Option<&Schema>) -> Arc<str> {
    let body = template::body(INSERT);
    Arc::from(template::render(body, schema).unwrap_or_else(|_| body.to_owned()))
}

/// Where and how messages are enqueued: outboxd's schema, and whether the statement may be
/// kept prepared. Build one at start and keep it.
#[derive(Debug, Clone)]
pub struct Outbox {
    insert: Arc<str>,
    prepared: bool,
}

impl Default for Outbox {
    /// outboxd's tables in the connection's `search_path` (`public`, by default), and the
    /// statement kept prepared, as sqlx does by default.
    fn default() -> Self {
        Self {
            insert: insert_in(None),
            prepared: true,
        }
    }
}

impl Outbox {
    /// outboxd's tables in `schema`, as `OUTBOXD_SCHEMA` put them.
    #[must_use]
    pub fn in_schema(mut self, schema: &Schema) -> Self {
        self.insert = insert_in(Some(schema));
        self
    }

    /// Whether the statement may be kept prepared on the server (the default). Through a
    /// transaction pooler (PgBouncer in transaction mode, most managed poolers), pass
    /// `false`: a statement left prepared on one server session is unknown to the next. Then
    /// enqueue in a transaction (as one does, with the business change): outside one, sqlx
    /// sends an unprepared statement's parse and execution apart, and the pooler may hand
    /// them to two server sessions.
    #[must_use]
    pub fn prepared(mut self, prepared: bool) -> Self {
        self.prepared = prepared;
        self
    }

    /// Inserts `message` with `executor`, usually the caller's transaction, and returns the
    /// row's id.
    pub async fn enqueue<'e, E>(
        &self,
        executor: E,
        message: NewMessage,
    ) -> Result<i64, EnqueueError>
    where
        E: PgExecutor<'e>,
    {
        let traceparent = message
            .traceparent()
            .map(str::to_owned)
            .or_else(current_traceparent);
        let id: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.insert)))
            .persistent(self.prepared)
            .bind(message.kind().as_str())
            .bind(message.payload())
            .bind(message.not_before())
            .bind(traceparent)
            .bind(message.priority())
            .bind(message.expires_at())
            .bind(message.idempotency_key())
            .bind((!message.tags().is_empty()).then(|| message.tags()))
            .fetch_optional(executor)
            .await?;
        id.ok_or(EnqueueError::KeyInFlight)
    }
}

/// Inserts `message` into `outbox_messages` with `executor`, usually the caller's
/// transaction: [`Outbox::default`]'s [`Outbox::enqueue`].
pub async fn enqueue<'e, E>(executor: E, message: NewMessage) -> Result<i64, EnqueueError>
where
    E: PgExecutor<'e>,
{
    static DEFAULT: std::sync::LazyLock<Outbox> = std::sync::LazyLock::new(Outbox::default);
    DEFAULT.enqueue(executor, message).await
}

#[cfg(test)]
mod tests {
    use super::{INSERT, Schema, template};

    #[test]
    fn the_insert_renders_in_a_schema_and_without_one() {
        let mail: Schema = "mail".parse().expect("a schema name");
        let body = template::body(INSERT);
        let bare = template::render(body, None).expect("renders");
        let in_mail = template::render(body, Some(&mail)).expect("renders");
        assert!(bare.contains("INSERT INTO outbox_messages"));
        assert!(in_mail.contains("INSERT INTO \"mail\".outbox_messages"));
        assert!(!in_mail.contains("{{"));
    }
}
