//! The store: the one value through which outboxd speaks to its database ([`Store`]). It
//! holds a pool and every statement's text, rendered once in the installation's schema
//! ([`super::statement`]), and sends each one prepared or not as the route to the database
//! allows. Kept prepared, a statement is named and cached per connection, so that
//! PostgreSQL parses and plans it once; past a transaction pooler, never: a pooler hands
//! each transaction to any server session, where a statement left prepared on one is
//! unknown to the next and collides with another client's of the same name. sqlx names a
//! statement whenever a query is `persistent`, even with its cache at 0, so the choice is
//! made here, for every statement the store sends.

use std::sync::Arc;
use std::time::Duration;

use outboxd_producer::{EnqueueError, NewMessage, Outbox, Schema};
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgExecutor, PgPool, Transaction};
use sqlx::{FromRow, Postgres};

use super::statement::{RenderError, Sql, render_all};

/// Whether statements may be kept prepared on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preparing {
    /// A direct connection, or a pooler in session mode: each statement is prepared once per
    /// connection.
    Kept,
    /// A transaction pooler is in the way (or a command runs few statements): none is kept.
    Never,
}

/// A pool, and how statements are sent on it: cheap to clone, and one per pool, all sharing
/// one rendering of the statements ([`Store::on`]).
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    statements: Arc<Statements>,
}

/// What every store of a process shares.
struct Statements {
    texts: Box<[Arc<str>]>,
    schema: Option<Schema>,
    preparing: Preparing,
    /// The producer crate's insert, in the same schema.
    outbox: Outbox,
}

impl Store {
    /// A store on `pool`, its statements in `schema` (`OUTBOXD_SCHEMA`), or the role's
    /// `search_path` without one.
    pub fn new(
        pool: PgPool,
        schema: Option<&Schema>,
        preparing: Preparing,
    ) -> Result<Self, RenderError> {
        let outbox = match schema {
            Some(schema) => Outbox::default().in_schema(schema),
            None => Outbox::default(),
        };
        Ok(Self {
            pool,
            statements: Arc::new(Statements {
                texts: render_all(schema)?,
                schema: schema.cloned(),
                preparing,
                outbox: outbox.prepared(preparing == Preparing::Kept),
            }),
        })
    }

    /// The same statements on another pool.
    pub fn on(&self, pool: PgPool) -> Self {
        Self {
            pool,
            statements: Arc::clone(&self.statements),
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes the pool: waits for its connections to come back, and closes them.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// The schema outboxd's objects are in, if one was named.
    pub fn schema(&self) -> Option<&Schema> {
        self.statements.schema.as_ref()
    }

    /// Whether statements are kept prepared: no transaction pooler is in the way.
    pub fn prepared(&self) -> bool {
        self.statements.preparing == Preparing::Kept
    }

    /// `object` (a table, or a function's signature) as a catalog lookup names it.
    pub(crate) fn qualified(&self, object: &str) -> String {
        match self.schema() {
            Some(schema) => format!("{}.{object}", schema.quoted()),
            None => object.to_owned(),
        }
    }

    /// The text of the statement named `name` (its block in `src/store/sql/`), as this
    /// store sends it: for reading its plan.
    pub fn statement_text(&self, name: &str) -> Option<&str> {
        let sql = Sql::ALL.iter().find(|sql| sql.name() == name)?;
        Some(&self.statements.texts[*sql as usize])
    }

    fn text(&self, sql: Sql) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(Arc::clone(&self.statements.texts[sql as usize]))
    }

    /// `sqlx::query` of `sql`, prepared or not as the route to the database allows.
    pub(crate) fn query<'q>(&self, sql: Sql) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(self.text(sql)).persistent(self.prepared())
    }

    /// `sqlx::query_as` of `sql`, prepared or not.
    pub(crate) fn query_as<'q, O>(&self, sql: Sql) -> QueryAs<'q, Postgres, O, PgArguments>
    where
        O: for<'r> FromRow<'r, PgRow>,
    {
        sqlx::query_as(self.text(sql)).persistent(self.prepared())
    }

    /// `sqlx::query_scalar` of `sql`, prepared or not.
    pub(crate) fn query_scalar<'q, O>(&self, sql: Sql) -> QueryScalar<'q, Postgres, O, PgArguments>
    where
        (O,): for<'r> FromRow<'r, PgRow>,
    {
        sqlx::query_scalar(self.text(sql)).persistent(self.prepared())
    }

    /// Runs `statement` on `connection`; past a transaction pooler, in a transaction of its
    /// own: sqlx sends an unprepared statement's parse and its execution as two exchanges,
    /// and only an open transaction keeps the pooler from handing the second to another
    /// server session ("unnamed prepared statement does not exist").
    pub(crate) async fn on_its_own<T, E: From<sqlx::Error>>(
        &self,
        connection: &mut PgConnection,
        statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        if self.prepared() {
            return statement(connection).await;
        }
        let mut transaction = connection.begin().await?;
        let result = statement(&mut transaction).await?;
        transaction.commit().await?;
        Ok(result)
    }

    /// Runs `statement` on a connection from the pool, on its own ([`Store::on_its_own`]).
    pub(crate) async fn alone<T, E: From<sqlx::Error>>(
        &self,
        statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut connection = self.pool.acquire().await?;
        self.on_its_own(&mut connection, statement).await
    }

    /// Executes `query` on a connection from the pool, on its own.
    pub(crate) async fn execute(
        &self,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<PgQueryResult, sqlx::Error> {
        self.alone(async |c| query.execute(c).await).await
    }

    /// Every row `query` returns, on a connection from the pool, on its own.
    pub(crate) async fn rows(
        &self,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, sqlx::Error> {
        self.alone(async |c| query.fetch_all(c).await).await
    }

    /// The one row `query` returns, on its own.
    pub(crate) async fn one<O: Row>(
        &self,
        query: QueryAs<'_, Postgres, O, PgArguments>,
    ) -> Result<O, sqlx::Error> {
        self.alone(async |c| query.fetch_one(c).await).await
    }

    /// The row `query` may return, on its own.
    pub(crate) async fn optional<O: Row>(
        &self,
        query: QueryAs<'_, Postgres, O, PgArguments>,
    ) -> Result<Option<O>, sqlx::Error> {
        self.alone(async |c| query.fetch_optional(c).await).await
    }

    /// Every row `query` returns, on its own.
    pub(crate) async fn all<O: Row>(
        &self,
        query: QueryAs<'_, Postgres, O, PgArguments>,
    ) -> Result<Vec<O>, sqlx::Error> {
        self.alone(async |c| query.fetch_all(c).await).await
    }

    /// The one value `query` returns, on its own.
    pub(crate) async fn scalar<O>(
        &self,
        query: QueryScalar<'_, Postgres, O, PgArguments>,
    ) -> Result<O, sqlx::Error>
    where
        O: Send + Unpin,
        (O,): for<'r> FromRow<'r, PgRow>,
    {
        self.alone(async |c| query.fetch_one(c).await).await
    }

    /// Every value `query` returns, on its own.
    pub(crate) async fn scalars<O>(
        &self,
        query: QueryScalar<'_, Postgres, O, PgArguments>,
    ) -> Result<Vec<O>, sqlx::Error>
    where
        O: Send + Unpin,
        (O,): for<'r> FromRow<'r, PgRow>,
    {
        self.alone(async |c| query.fetch_all(c).await).await
    }

    /// A transaction on a connection from the pool whose statements the server cancels
    /// past `bound`. The bounds are the transaction's own (`SET LOCAL`, sent with `BEGIN`
    /// in one round trip), so that they never reach another session, as they would through
    /// a pooler in transaction mode.
    pub(crate) async fn begin_bounded(
        &self,
        bound: Bound,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.begin_bounded_many(&[bound]).await
    }

    /// [`Store::begin_bounded`] with several bounds.
    pub(crate) async fn begin_bounded_many(
        &self,
        bounds: &[Bound],
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin_with(begin_with_bounds(bounds)).await
    }

    /// Inserts a message in the caller's transaction (or on any executor), so that it is
    /// committed, or rolled back, with the business change that caused it: the producer
    /// crate's `enqueue`, in this store's schema and with its statement prepared or not, as
    /// the route to the database allows. Applications use that crate
    /// (`outboxd-producer`) itself.
    pub async fn enqueue<'e, E>(
        &self,
        executor: E,
        message: NewMessage,
    ) -> Result<i64, EnqueueError>
    where
        E: PgExecutor<'e>,
    {
        self.statements.outbox.enqueue(executor, message).await
    }

    /// [`Store::enqueue`] on a connection from the pool, on its own: through a transaction
    /// pooler, outside a transaction, an unprepared statement's parse and its execution
    /// could reach two server sessions.
    pub async fn enqueue_alone(&self, message: NewMessage) -> Result<i64, EnqueueError> {
        self.alone(async |c| self.enqueue(c, message).await).await
    }
}

/// What the server cancels a bounded transaction's statement for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bound {
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

/// [`Store::begin_bounded`] on a connection the caller holds, with several bounds.
pub(crate) async fn begin_bounded_on<'c>(
    connection: &'c mut PgConnection,
    bounds: &[Bound],
) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
    connection.begin_with(begin_with_bounds(bounds)).await
}

/// What a row read into `O` needs: `query_as`'s bounds, sent between tasks.
pub(crate) trait Row: for<'r> FromRow<'r, PgRow> + Send + Unpin {}
impl<O: for<'r> FromRow<'r, PgRow> + Send + Unpin> Row for O {}

/// A statement of outboxd's own that no store renders: a setting, or the catalog.
pub(crate) fn raw(sql: &'static str) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql).persistent(false)
}
