//! How statements are sent: kept prepared on the server (named, and cached per connection,
//! so that PostgreSQL parses and plans each once), or, past a transaction pooler, never
//! (unnamed, parsed with the execution that uses them). A transaction pooler hands each
//! transaction to any server session: a statement left prepared on one is unknown to the
//! next, and collides with another client's of the same name. sqlx names a statement
//! whenever a query is `persistent`, even with its cache at 0, so the choice is made here,
//! for every statement the store sends. It is the process's, made once at start
//! ([`keep_no_statement_prepared`]), as its route to the database is. Each statement's
//! text is put in outboxd's schema here too ([`super::schema`]).

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use std::time::Duration;

use sqlx::{Connection as _, PgConnection, PgPool, Transaction};
use sqlx::{FromRow, Postgres, SqlSafeStr};

use super::schema::in_schema;

static PREPARED: AtomicBool = AtomicBool::new(true);

/// From now on, no statement is kept prepared: a transaction pooler is in the way.
pub fn keep_no_statement_prepared() {
    PREPARED.store(false, Ordering::Relaxed);
}

/// Whether statements are kept prepared: no transaction pooler is in the way.
pub fn prepared() -> bool {
    PREPARED.load(Ordering::Relaxed)
}

/// Runs one statement on `connection`; past a transaction pooler, in a transaction of its
/// own: sqlx sends an unprepared statement's parse and its execution as two exchanges,
/// and only an open transaction keeps the pooler from handing the second to another
/// server session ("unnamed prepared statement does not exist").
pub async fn on_its_own<T, E: From<sqlx::Error>>(
    connection: &mut PgConnection,
    statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E> {
    if prepared() {
        return statement(connection).await;
    }
    let mut transaction = connection.begin().await?;
    let result = statement(&mut transaction).await?;
    transaction.commit().await?;
    Ok(result)
}

/// What the server cancels a bounded transaction's statement for.
#[derive(Debug, Clone, Copy)]
pub enum Bound {
    /// Running longer than this: a read whose walk grows (under a transaction left open
    /// elsewhere, or over a day of sends) must neither outlive the caller's wait nor keep
    /// its connection busy.
    Statement(Duration),
    /// Waiting longer than this for a lock another transaction holds: an application's
    /// transaction left open must not hold one of outboxd's connections as long.
    Lock(Duration),
    /// Its client gone, checked this often (`client_connection_check_interval`, PostgreSQL
    /// 14 and later; older servers go without): a statement whose caller left ends then,
    /// not at its timeout.
    ClientGone(Duration),
}

impl Bound {
    /// The statement that sets it for the transaction alone.
    fn set_local(self) -> String {
        let millis = |within: Duration| within.as_millis().clamp(1, i32::MAX as u128);
        match self {
            Bound::Statement(within) => {
                format!("SET LOCAL statement_timeout = {}", millis(within))
            }
            Bound::Lock(within) => format!("SET LOCAL lock_timeout = {}", millis(within)),
            Bound::ClientGone(every) => format!(
                "SELECT set_config('client_connection_check_interval', '{}', true) \
                 WHERE current_setting('server_version_num')::int >= 140000",
                millis(every)
            ),
        }
    }
}

/// `BEGIN` and each bound's setting, in one round trip.
fn begin_with_bounds(bounds: &[Bound]) -> sqlx::AssertSqlSafe<String> {
    let mut sql = String::from("BEGIN");
    for bound in bounds {
        sql.push_str("; ");
        sql.push_str(&bound.set_local());
    }
    sqlx::AssertSqlSafe(sql)
}

/// A transaction on a connection from `pool` whose statements the server cancels past
/// `bound`. The bounds are the transaction's own (`SET LOCAL`, sent with `BEGIN` in one
/// round trip), so that they never reach another session, as they would through a pooler
/// in transaction mode.
pub async fn begin_bounded(
    pool: &PgPool,
    bound: Bound,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    pool.begin_with(begin_with_bounds(&[bound])).await
}

/// [`begin_bounded`] on a connection the caller holds, with several bounds.
pub async fn begin_bounded_on<'c>(
    connection: &'c mut PgConnection,
    bounds: &[Bound],
) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
    connection.begin_with(begin_with_bounds(bounds)).await
}

/// Executes `statement` on a connection from `pool`, on its own (see [`on_its_own`]).
pub async fn execute_alone(
    statement: Query<'_, Postgres, PgArguments>,
    pool: &PgPool,
) -> Result<PgQueryResult, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    on_its_own(&mut connection, async |c| statement.execute(c).await).await
}

/// The typed fetches of [`on_its_own`] on a connection from a pool: each takes a
/// `query_as` statement and runs it with the fetch of the same name.
macro_rules! typed_fetch_alone {
    ($($(#[$doc:meta])* $name:ident => $fetch:ident -> $output:ty;)*) => {$(
        $(#[$doc])*
        pub async fn $name<O>(
            statement: QueryAs<'_, Postgres, O, PgArguments>,
            pool: &PgPool,
        ) -> Result<$output, sqlx::Error>
        where
            O: for<'r> FromRow<'r, PgRow> + Send + Unpin,
        {
            let mut connection = pool.acquire().await?;
            on_its_own(&mut connection, async |c| statement.$fetch(c).await).await
        }
    )*};
}

typed_fetch_alone! {
    /// The row `statement` may return, on its own.
    fetch_optional_alone => fetch_optional -> Option<O>;
    /// Every row `statement` returns, on its own.
    fetch_all_alone => fetch_all -> Vec<O>;
    /// The one row `statement` returns, on its own.
    fetch_one_alone => fetch_one -> O;
}

/// The rows a plain `statement` returns, on a connection from `pool`, on its own.
pub async fn fetch_rows_alone(
    statement: Query<'_, Postgres, PgArguments>,
    pool: &PgPool,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    on_its_own(&mut connection, async |c| statement.fetch_all(c).await).await
}

/// `sqlx::query`, prepared or not as the route to the database allows.
pub fn query<'q>(sql: impl SqlSafeStr) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(in_schema(sql)).persistent(prepared())
}

/// `sqlx::query_as`, prepared or not as the route to the database allows.
pub fn query_as<'q, O>(sql: impl SqlSafeStr) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(in_schema(sql)).persistent(prepared())
}

/// `sqlx::query_scalar`, prepared or not as the route to the database allows.
pub fn query_scalar<'q, O>(sql: impl SqlSafeStr) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_scalar(in_schema(sql)).persistent(prepared())
}
