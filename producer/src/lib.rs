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
mod recall;
pub mod schema;
mod secret;
pub mod template;
mod trace;

pub use message::{
    InvalidMessage, Kind, MAX_IDEMPOTENCY_KEY_CHARS, MAX_KIND_CHARS, MAX_PRIORITY, MAX_TAG_CHARS,
    MAX_TAGS, MAX_TRACEPARENT_CHARS, NewMessage, TIME_RANGE_SECS, Tag,
};
pub use recall::{CancelAnswer, ReplaceAnswer, Replaced};
pub use schema::{InvalidSchema, Schema};
pub use secret::{MAX_SECRET_FIELDS, MAX_SECRET_NAME_CHARS, MAX_SECRET_PATH_NAMES, SecretField};
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

/// Why a message was not withdrawn or replaced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecallError {
    /// The statement failed (the caller's transaction is then aborted, as after any error):
    /// among others, `outbox_replace` on a key of another kind, or a role that may not
    /// execute the function.
    #[error("could not call outboxd's function: {0}")]
    Database(#[from] sqlx::Error),
    /// The function answered a word this crate does not know: a newer outboxd.
    #[error("outboxd answered {0:?}, which this version of outboxd-producer does not know")]
    UnknownAnswer(String),
    /// [`Outbox::replace`] finds the message to replace by its idempotency key: give one.
    #[error("a replace needs an idempotency key: it finds the message to replace by it")]
    NoKey,
    /// `outbox_replace` keeps the secret fields the message was enqueued with: declare them
    /// for the kind (`secret_fields` in its `kind.toml`) instead.
    #[error(
        "a replace cannot name secret fields of its own: declare them in the kind's kind.toml (secret_fields)"
    )]
    SecretFields,
}

/// The statements, as templates: `{{schema}}` marks outboxd's objects.
const INSERT: &str = include_str!("sql/enqueue.sql");
const CANCEL: &str = include_str!("sql/cancel.sql");
const CANCEL_ID: &str = include_str!("sql/cancel_id.sql");
const REPLACE: &str = include_str!("sql/replace.sql");

/// A statement's text in `schema`. The files have no marker but `{{schema}}`, which always
/// renders (`the_statements_render_in_a_schema_and_without_one`).
fn in_schema(template: &str, schema: Option<&Schema>) -> Arc<str> {
    let body = template::body(template);
    Arc::from(template::render(body, schema).unwrap_or_else(|_| body.to_owned()))
}

/// The statements' texts in one schema.
#[derive(Debug, Clone)]
struct Statements {
    insert: Arc<str>,
    cancel: Arc<str>,
    cancel_id: Arc<str>,
    replace: Arc<str>,
}

impl Statements {
    fn in_schema(schema: Option<&Schema>) -> Self {
        Self {
            insert: in_schema(INSERT, schema),
            cancel: in_schema(CANCEL, schema),
            cancel_id: in_schema(CANCEL_ID, schema),
            replace: in_schema(REPLACE, schema),
        }
    }
}

/// Where and how messages are enqueued: outboxd's schema, and whether the statement may be
/// kept prepared. Build one at start and keep it.
#[derive(Debug, Clone)]
pub struct Outbox {
    statements: Statements,
    prepared: bool,
}

impl Default for Outbox {
    /// outboxd's tables in the connection's `search_path` (`public`, by default), and the
    /// statement kept prepared, as sqlx does by default.
    fn default() -> Self {
        Self {
            statements: Statements::in_schema(None),
            prepared: true,
        }
    }
}

impl Outbox {
    /// outboxd's tables in `schema`, as `OUTBOXD_SCHEMA` put them.
    #[must_use]
    pub fn in_schema(mut self, schema: &Schema) -> Self {
        self.statements = Statements::in_schema(Some(schema));
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
        let id: Option<i64> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.statements.insert)))
                .persistent(self.prepared)
                .bind(message.kind().as_str())
                .bind(message.payload())
                .bind(message.not_before())
                .bind(traceparent)
                .bind(message.priority())
                .bind(message.expires_at())
                .bind(message.idempotency_key())
                .bind((!message.tags().is_empty()).then(|| message.tags()))
                .bind(secret_fields(&message))
                .fetch_optional(executor)
                .await?;
        id.ok_or(EnqueueError::KeyInFlight)
    }

    /// Withdraws the message enqueued with `key`, in `executor` (the caller's transaction):
    /// [`CancelAnswer::Cancelled`] means it will never be sent once the transaction
    /// commits. `who` is written on its timeline (the session's role when `None`). The role
    /// needs `EXECUTE` on `outbox_cancel` (outboxd's deployment page).
    pub async fn cancel<'e, E>(
        &self,
        executor: E,
        key: &str,
        who: Option<&str>,
    ) -> Result<CancelAnswer, RecallError>
    where
        E: PgExecutor<'e>,
    {
        let answer: String =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.statements.cancel)))
                .persistent(self.prepared)
                .bind(key)
                .bind(who)
                .fetch_one(executor)
                .await?;
        CancelAnswer::parse(&answer).ok_or(RecallError::UnknownAnswer(answer))
    }

    /// Withdraws the message `id`, as [`Outbox::cancel`] does by key.
    pub async fn cancel_id<'e, E>(
        &self,
        executor: E,
        id: i64,
        who: Option<&str>,
    ) -> Result<CancelAnswer, RecallError>
    where
        E: PgExecutor<'e>,
    {
        let answer: String =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.statements.cancel_id)))
                .persistent(self.prepared)
                .bind(id)
                .bind(who)
                .fetch_one(executor)
                .await?;
        CancelAnswer::parse(&answer).ok_or(RecallError::UnknownAnswer(answer))
    }

    /// Enqueues `message`, which must have an idempotency key, or, when the key's message
    /// is still pending and no replica holds it, replaces what it says and when it is due:
    /// the latest wins ("one reminder per user, at most every 10 minutes": a key per user
    /// and a `not_before` 10 minutes ahead). Otherwise answers what stopped it and changes
    /// nothing. The role needs `EXECUTE` on `outbox_replace`.
    pub async fn replace<'e, E>(
        &self,
        executor: E,
        message: NewMessage,
    ) -> Result<Replaced, RecallError>
    where
        E: PgExecutor<'e>,
    {
        if message.idempotency_key().is_none() {
            return Err(RecallError::NoKey);
        }
        if !message.secret_fields().is_empty() {
            return Err(RecallError::SecretFields);
        }
        let traceparent = message
            .traceparent()
            .map(str::to_owned)
            .or_else(current_traceparent);
        let (id, answer): (i64, String) =
            sqlx::query_as(sqlx::AssertSqlSafe(Arc::clone(&self.statements.replace)))
                .persistent(self.prepared)
                .bind(message.kind().as_str())
                .bind(message.payload())
                .bind(message.idempotency_key())
                .bind(message.not_before())
                .bind(message.expires_at())
                .bind(message.priority())
                .bind((!message.tags().is_empty()).then(|| message.tags()))
                .bind(traceparent)
                .fetch_one(executor)
                .await?;
        let answer = ReplaceAnswer::parse(&answer).ok_or(RecallError::UnknownAnswer(answer))?;
        Ok(Replaced { id, answer })
    }
}

/// A message's own secret fields as the table's column takes them: null for none.
fn secret_fields(message: &NewMessage) -> Option<Vec<&str>> {
    let fields = message.secret_fields();
    (!fields.is_empty()).then(|| fields.iter().map(SecretField::as_str).collect())
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
    use super::{CANCEL, CANCEL_ID, INSERT, REPLACE, Schema, template};

    #[test]
    fn the_statements_render_in_a_schema_and_without_one() {
        let mail: Schema = "mail".parse().expect("a schema name");
        for (template, object) in [
            (INSERT, "outbox_messages"),
            (CANCEL, "outbox_cancel("),
            (CANCEL_ID, "outbox_cancel_id("),
            (REPLACE, "outbox_replace("),
        ] {
            let body = template::body(template);
            let bare = template::render(body, None).expect("renders");
            let in_mail = template::render(body, Some(&mail)).expect("renders");
            assert!(bare.contains(&format!(" {object}")), "{bare}");
            assert!(in_mail.contains(&format!("\"mail\".{object}")), "{in_mail}");
            assert!(!in_mail.contains("{{"));
        }
    }
}
