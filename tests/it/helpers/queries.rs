//! A test's look into its database: one value or one row of a statement, with its one
//! parameter, without the five lines of sqlx each takes.

use sqlx::postgres::PgRow;
use sqlx::{Decode, Encode, FromRow, Postgres, Type};

use super::TestDb;

impl TestDb {
    /// The one value `sql` returns with `arg` as `$1`.
    pub async fn scalar<'a, T, A>(&self, sql: &'static str, arg: A) -> T
    where
        T: for<'r> Decode<'r, Postgres> + Type<Postgres> + Send + Unpin,
        A: Encode<'a, Postgres> + Type<Postgres> + Send + 'a,
    {
        let (value,): (T,) = self.one_row(sql, arg).await;
        value
    }

    /// An application's transaction holding `table` in ACCESS EXCLUSIVE mode, until it
    /// ends: whatever reads or writes the table waits.
    pub async fn lock_table(&self, table: &str) -> sqlx::Transaction<'static, Postgres> {
        self.transaction_after(format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            .await
    }

    /// An application's transaction, still open, that has run `sql` (its business change).
    pub async fn transaction_after(
        &self,
        sql: impl Into<String>,
    ) -> sqlx::Transaction<'static, Postgres> {
        let sql = sql.into();
        let mut tx = self.pool.begin().await.expect("a transaction");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        tx
    }

    /// A login role of this test's database, made by `setup` (SQL in which `{role}` stands
    /// for its name), and the database's URL as that role.
    pub async fn role(&self, prefix: &str, setup: &str) -> (String, String) {
        let role = format!("{prefix}_{}", &self.name[self.name.len() - 8..]);
        self.exec(setup.replace("{role}", &role)).await;
        let url = self.url.replacen("postgres@", &format!("{role}@"), 1);
        assert_ne!(url, self.url);
        (role, url)
    }

    /// How many sessions of this database `condition` (SQL on `pg_stat_activity`) holds for.
    pub async fn sessions(&self, condition: &str) -> i64 {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND {condition}"
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("pg_stat_activity")
    }

    /// Runs `sql`, which the test wrote, to its end.
    pub async fn exec(&self, sql: impl Into<String>) {
        let sql = sql.into();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one row `sql` returns with `arg` as `$1`.
    pub async fn one_row<'a, T, A>(&self, sql: &'static str, arg: A) -> T
    where
        T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
        A: Encode<'a, Postgres> + Type<Postgres> + Send + 'a,
    {
        sqlx::query_as(sql)
            .bind(arg)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}
