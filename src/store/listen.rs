//! LISTEN/NOTIFY: the dispatcher's listening connection, the linger on it, and the check
//! that a notification sent comes back. Through a transaction pooler it does not: the
//! pooler hands each transaction to any server connection, so the one that ran `LISTEN`
//! is not ours by the time a notification reaches it.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{Connection as _, PgConnection, Row as _};

use super::NOTIFY_CHANNEL;
use super::statement::Sql;
use super::statements::Store;

/// The channel of the notification check: outboxd's own, so that a check never reads as a
/// new message.
pub const CHECK_CHANNEL: &str = "outbox_notification_check";

/// How long a connection's statement may wait for a server session before a pooler counts
/// as in the way.
const SESSION_WAIT: Duration = Duration::from_secs(2);

/// A connection listening for the insert trigger's notifications, and for the checks.
pub async fn listen(store: &Store) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(store.pool()).await?;
    listener.listen_all([NOTIFY_CHANNEL, CHECK_CHANNEL]).await?;
    Ok(listener)
}

/// Sleeps `linger` on the listening connection. PostgreSQL delivers the notifications of
/// commits meanwhile together when the command ends; read them with `next_buffered`.
pub async fn linger(
    store: &Store,
    listener: &mut PgListener,
    linger: Duration,
) -> Result<(), sqlx::Error> {
    store
        .query(Sql::Linger)
        .bind(linger.as_secs_f64())
        .execute(listener)
        .await?;
    Ok(())
}

/// Sends a check's notification on [`CHECK_CHANNEL`], `token` a UUID (written into the
/// statement: one simple-protocol message, which a transaction pooler cannot split).
pub async fn send_check(store: &Store, token: uuid::Uuid) -> Result<(), sqlx::Error> {
    let statement = format!("SELECT pg_notify('{CHECK_CHANNEL}', '{token}')");
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(store.pool())
        .await?;
    Ok(())
}

/// Whether a transaction pooler (PgBouncer in transaction mode, most managed poolers) is
/// between outboxd and PostgreSQL at `options`: whether a connection keeps its server
/// session while another holds a transaction open. Through a transaction pooler the
/// connection's next statement gets another server session, or waits for one. Nothing here
/// LISTENs: through such a pooler a LISTEN stays on a server session that other clients
/// then get, with notifications they do not expect.
pub async fn transaction_pooler_in_the_way(
    options: &PgConnectOptions,
) -> Result<bool, sqlx::Error> {
    let options = options.clone().statement_cache_capacity(0);
    let mut first = PgConnection::connect_with(&options).await?;
    let mut second = PgConnection::connect_with(&options).await?;
    let backend = "SELECT pg_backend_pid()";
    let before: i32 = sqlx::raw_sql(backend)
        .fetch_one(&mut first)
        .await?
        .try_get(0)?;
    let mut held = second.begin().await?;
    sqlx::raw_sql(backend).fetch_one(&mut *held).await?;
    let after =
        tokio::time::timeout(SESSION_WAIT, sqlx::raw_sql(backend).fetch_one(&mut first)).await;
    held.rollback().await?;
    let pooled = match after {
        Ok(row) => row?.try_get::<i32, _>(0)? != before,
        // Waiting for a server session the other connection holds.
        Err(_) => true,
    };
    let _ = second.close().await;
    drop(first);
    Ok(pooled)
}

/// Whether a notification sent on `store` comes back to a connection listening on
/// `listen`, within two seconds. Only for connections that keep their session: never
/// through a transaction pooler (see [`transaction_pooler_in_the_way`]).
pub async fn notification_round_trip(
    store: &Store,
    listen_on: &Store,
) -> Result<bool, sqlx::Error> {
    let mut listener = listen(listen_on).await?;
    let token = uuid::Uuid::new_v4();
    send_check(store, token).await?;
    let token = token.to_string();
    let came_back = tokio::time::timeout(SESSION_WAIT, async {
        while let Some(notification) = listener.try_recv().await? {
            if notification.channel() == CHECK_CHANNEL && notification.payload() == token {
                return Ok::<bool, sqlx::Error>(true);
            }
        }
        Ok(false)
    })
    .await;
    Ok(matches!(came_back, Ok(Ok(true))))
}
