//! Whether the database holds the schema this build expects, and whether outboxd may write
//! to it: what start-up, the command line and readiness ask.

use sqlx::FromRow;

use super::rights::{self, Rights};
use super::statement::Sql;
use super::{MIGRATOR, Store};

/// Whether the database holds the schema this build expects.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the outbox schema is missing (from OUTBOXD_SCHEMA, or the search path without it): run `outboxd migrate` first"
    )]
    Missing,
    #[error(
        "the outbox schema is at version {applied}, this outboxd needs {expected}: run `outboxd migrate`"
    )]
    Outdated { applied: i64, expected: i64 },
    #[error(
        "the outbox schema is at version {applied}, newer than this outboxd knows ({expected}), and runs only releases that know version {runs_from}: run a newer outboxd"
    )]
    Newer {
        applied: i64,
        expected: i64,
        runs_from: i64,
    },
    #[error(
        "a migration failed part-way (version {0}): fix it by hand, then run `outboxd migrate`"
    )]
    Dirty(i64),
    #[error("the migrations are recorded but the table outbox_messages is missing")]
    TableMissing,
    /// The schema is right, but outboxd could not record an outcome.
    #[error("outboxd cannot write: {0}")]
    NotWritable(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// How the schema stands to this build, when this build may run on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaFit {
    /// Every migration this build embeds, and no other.
    Current,
    /// Every migration this build embeds, and later ones of a newer release (a rolling
    /// upgrade's migrate Job ran ahead, or that release was rolled back) that leave it
    /// able to run: migrations are additive.
    Newer { applied: i64, expected: i64 },
}

/// Fails unless every migration this build embeds has been applied, and any later one
/// leaves this build able to run (`outbox_installation.runs_from_schema`, migration 33).
/// Start-up and the CLI check this; readiness also checks that outboxd can write
/// ([`check_ready`]).
pub async fn check_schema(store: &Store) -> Result<SchemaFit, SchemaError> {
    let fit = schema_state(store, Rights::default()).await?.schema()?;
    if let SchemaFit::Newer { applied, expected } = fit {
        let runs_from: Option<i64> = store
            .scalar(store.query_scalar(Sql::RunsFromSchema))
            .await?;
        if let Some(runs_from) = runs_from.filter(|&version| version > expected) {
            return Err(SchemaError::Newer {
                applied,
                expected,
                runs_from,
            });
        }
    }
    Ok(fit)
}

/// [`check_schema`]'s migrations, and that outboxd can write the table: not a read-only
/// database or standby, and a role with each of `rights`. One query: readiness runs it
/// often. A schema newer than this build is ready here whatever `runs_from_schema` says:
/// a replica that is running keeps working while a rolling upgrade replaces it.
pub async fn check_ready(store: &Store, rights: Rights) -> Result<(), SchemaError> {
    let state = schema_state(store, rights).await?;
    state.schema()?;
    match state.not_writable {
        Some(reason) => Err(SchemaError::NotWritable(reason)),
        None => Ok(()),
    }
}

/// What the database says of the schema and of outboxd's right to write.
#[derive(FromRow)]
struct SchemaState {
    applied: Vec<i64>,
    failed: Vec<i64>,
    table_exists: bool,
    not_writable: Option<String>,
}

async fn schema_state(store: &Store, rights: Rights) -> Result<SchemaState, SchemaError> {
    let (objects, privileges, functions) = rights::as_columns(store, rights);
    let state = store
        .one(
            store
                .query_as(Sql::SchemaState)
                .bind(objects)
                .bind(privileges)
                .bind(functions),
        )
        .await;
    match state {
        Ok(state) => Ok(state),
        // undefined_table: never migrated.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
            Err(SchemaError::Missing)
        }
        Err(e) => Err(e.into()),
    }
}

impl SchemaState {
    fn schema(&self) -> Result<SchemaFit, SchemaError> {
        if let Some(version) = self.failed.first() {
            return Err(SchemaError::Dirty(*version));
        }
        let (Some(&applied), Some(expected)) = (
            self.applied.last(),
            MIGRATOR.iter().map(|m| m.version).max(),
        ) else {
            return Err(SchemaError::Missing);
        };
        if !MIGRATOR.iter().all(|m| self.applied.contains(&m.version)) {
            return Err(SchemaError::Outdated { applied, expected });
        }
        if !self.table_exists {
            return Err(SchemaError::TableMissing);
        }
        if applied > expected {
            return Ok(SchemaFit::Newer { applied, expected });
        }
        Ok(SchemaFit::Current)
    }
}
