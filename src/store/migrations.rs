//! outboxd's migrations, recorded in a table of its own, `outbox_schema_migrations`, never
//! in sqlx's default `_sqlx_migrations`: that is the table an application's own
//! `sqlx migrate` uses, in the same database, and sharing it made each side fail on the
//! other's migrations ("previously applied but is missing", "newer than this outboxd
//! knows").

use sqlx::PgPool;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection as _, PgConnection};

use super::statements::{query, query_as, query_scalar};

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
/// In a schema of outboxd's own ([`super::schema`]), the migrations run with it as the
/// connection's `search_path`, on a connection that is then closed rather than returned to
/// the pool: their text names no schema, so that the same migrations serve both.
/// Migrations go over a direct connection anyway (sqlx's lock is a session's), where a
/// session's setting holds.
pub async fn migrate(pool: &PgPool) -> Result<(), MigrateError> {
    let mut connection = pool.acquire().await?;
    let mut migrator = Migrator {
        migrations: MIGRATOR.migrations.clone(),
        ..Migrator::DEFAULT
    };
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    let Some(schema) = super::schema::current() else {
        carry_over(&mut connection).await?;
        return run_and_log(&migrator, &mut connection).await;
    };
    // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema is
    // there: a schema a DBA made for a role without it must not fail.
    let exists: bool = query_scalar("SELECT to_regnamespace($1) IS NOT NULL")
        .bind(schema.quoted())
        .fetch_one(&mut *connection)
        .await?;
    if !exists {
        migrator.create_schema(schema.quoted());
    }
    let mut connection = connection.detach();
    query(sqlx::AssertSqlSafe(format!(
        "SELECT set_config('search_path', '{}', false)",
        schema.quoted()
    )))
    .execute(&mut connection)
    .await?;
    let migrated = run_and_log(&migrator, &mut connection).await;
    let _ = connection.close().await;
    migrated
}

/// Runs the migrations, logging each one applied: otherwise a first `migrate` and one with
/// nothing to do would say the same (that the schema is up to date).
async fn run_and_log(
    migrator: &Migrator,
    connection: &mut PgConnection,
) -> Result<(), MigrateError> {
    let before: Vec<i64> =
        query_scalar("SELECT version FROM outbox_schema_migrations WHERE success")
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
async fn carry_over(connection: &mut PgConnection) -> Result<(), sqlx::Error> {
    let mut transaction = connection.begin().await?;
    query("SELECT pg_advisory_xact_lock(hashtext('outbox_schema_migrations'))")
        .execute(&mut *transaction)
        .await?;
    let (ours, old): (bool, bool) = query_as(
        "SELECT to_regclass('outbox_schema_migrations') IS NOT NULL, \
                to_regclass('_sqlx_migrations') IS NOT NULL",
    )
    .fetch_one(&mut *transaction)
    .await?;
    if ours || !old {
        return transaction.commit().await;
    }
    let versions: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    let copied: i64 = query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE version = ANY($1)")
        .bind(&versions)
        .fetch_one(&mut *transaction)
        .await?;
    if copied == 0 {
        return transaction.commit().await;
    }
    // The same columns sqlx gives a migrations table.
    query(
        "CREATE TABLE outbox_schema_migrations ( \
             version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
             installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
             checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .execute(&mut *transaction)
    .await?;
    query(
        "INSERT INTO outbox_schema_migrations \
             (version, description, installed_on, success, checksum, execution_time) \
         SELECT version, description, installed_on, success, checksum, execution_time \
         FROM _sqlx_migrations WHERE version = ANY($1)",
    )
    .bind(&versions)
    .execute(&mut *transaction)
    .await?;
    tracing::info!(
        migrations = copied,
        "recorded outboxd's migrations in outbox_schema_migrations, copied from _sqlx_migrations"
    );
    transaction.commit().await
}
