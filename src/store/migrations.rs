//! outboxd's migrations, recorded in a table of its own, `outbox_schema_migrations`, never
//! in sqlx's default `_sqlx_migrations`: that is the table an application's own
//! `sqlx migrate` uses, in the same database, and sharing it made each side fail on the
//! other's migrations ("previously applied but is missing", "newer than this outboxd
//! knows").

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection as _, PgConnection};

use super::statement::Sql;
use super::statements::Store;

/// The table outboxd records its migrations in.
pub const MIGRATIONS_TABLE: &str = "outbox_schema_migrations";

/// The schema, embedded in the binary. Its table is set by [`migrate`], which is the way
/// to run it.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Applies the migrations, recording them in [`MIGRATIONS_TABLE`]. A database migrated by
/// an outboxd before 0.3 recorded them in `_sqlx_migrations`: those rows are copied over
/// first (and left where they are, which older replicas still read during a rolling
/// upgrade; `DELETE` them once none runs, see the book's Operations page).
///
/// In a schema of outboxd's own (`OUTBOXD_SCHEMA`), the migrations run with it as the
/// connection's `search_path`, on a connection that is then closed rather than returned to
/// the pool: their text names no schema, so that the same migrations serve both.
/// Migrations go over a direct connection anyway (sqlx's lock is a session's), where a
/// session's setting holds.
pub async fn migrate(store: &Store) -> Result<(), MigrateError> {
    let mut connection = store.pool().acquire().await?;
    let mut migrator = Migrator {
        migrations: MIGRATOR.migrations.clone(),
        ..Migrator::DEFAULT
    };
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    let Some(schema) = store.schema() else {
        carry_over(store, &mut connection).await?;
        return run_and_log(store, &migrator, &mut connection).await;
    };
    // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema is
    // there: a schema a DBA made for a role without it must not fail.
    let exists: bool = store
        .query_scalar(Sql::SchemaExists)
        .bind(schema.quoted())
        .fetch_one(&mut *connection)
        .await?;
    if !exists {
        migrator.create_schema(schema.quoted());
    }
    let mut connection = connection.detach();
    store
        .query(Sql::SetSearchPath)
        .bind(schema.quoted())
        .execute(&mut connection)
        .await?;
    let migrated = run_and_log(store, &migrator, &mut connection).await;
    let _ = connection.close().await;
    migrated
}

/// Runs the migrations, logging each one applied: otherwise a first `migrate` and one with
/// nothing to do would say the same (that the schema is up to date).
async fn run_and_log(
    store: &Store,
    migrator: &Migrator,
    connection: &mut PgConnection,
) -> Result<(), MigrateError> {
    let before: Vec<i64> = store
        .query_scalar(Sql::AppliedMigrations)
        .fetch_all(&mut *connection)
        .await
        // No table yet: nothing applied.
        .unwrap_or_default();
    migrator.run(&mut *connection).await?;
    let applied = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !before.contains(&m.version));
    for migration in applied {
        tracing::info!(
            version = migration.version,
            description = %migration.description,
            "applied migration"
        );
    }
    Ok(())
}

/// Copies outboxd's rows of `_sqlx_migrations` into a new [`MIGRATIONS_TABLE`], once: only
/// when that table does not exist yet, under a lock that a concurrent `migrate` waits on.
async fn carry_over(store: &Store, connection: &mut PgConnection) -> Result<(), sqlx::Error> {
    let mut transaction = connection.begin().await?;
    store
        .query(Sql::LockMigrationsTable)
        .execute(&mut *transaction)
        .await?;
    let (ours, old): (bool, bool) = store
        .query_as(Sql::MigrationsTables)
        .fetch_one(&mut *transaction)
        .await?;
    if ours || !old {
        return transaction.commit().await;
    }
    let versions: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    let copied: i64 = store
        .query_scalar(Sql::CountOldMigrations)
        .bind(&versions)
        .fetch_one(&mut *transaction)
        .await?;
    if copied == 0 {
        return transaction.commit().await;
    }
    // The same columns sqlx gives a migrations table.
    store
        .query(Sql::CreateMigrationsTable)
        .execute(&mut *transaction)
        .await?;
    store
        .query(Sql::CopyOldMigrations)
        .bind(&versions)
        .execute(&mut *transaction)
        .await?;
    tracing::info!(
        migrations = copied,
        "recorded outboxd's migrations in outbox_schema_migrations, copied from _sqlx_migrations"
    );
    transaction.commit().await
}
