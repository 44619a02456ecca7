//! The doctor's database checks: reachable, its version, the schema and the role's rights,
//! the indexes, a transaction left open, the table's vacuum, and notifications.

use std::time::Duration;

use crate::store::Store;

use super::{Finding, OLDEST_TESTED, Verdict, finding};
use crate::config::RunConfig;
use crate::store::{self, SchemaError, inspect};

pub(super) async fn checks(pool: &Store, config: &RunConfig, long: Duration) -> Vec<Finding> {
    let mut found = vec![version(pool).await];
    found.push(match store::check_ready(pool, config.rights()).await {
        Ok(()) => finding(
            Verdict::Ok,
            "schema",
            "current, and the role has every right outboxd run uses",
        ),
        Err(SchemaError::NotWritable(reason)) => finding(
            Verdict::Fail,
            "rights",
            format!("{reason}; grant it (the book's Deployment page, Roles and rights)"),
        ),
        Err(e) => finding(Verdict::Fail, "schema", e.to_string()),
    });
    found.push(match inspect::invalid_indexes(pool).await {
        Ok(invalid) if invalid.is_empty() => finding(Verdict::Ok, "indexes", "all valid"),
        Ok(invalid) => finding(
            Verdict::Fail,
            "indexes",
            format!("{} invalid (a CREATE INDEX CONCURRENTLY failed): drop them and run outboxd migrate", invalid.join(", ")),
        ),
        Err(e) => finding(Verdict::Fail, "indexes", e.to_string()),
    });
    found.push(open_transaction(pool, long).await);
    found.push(vacuum(pool).await);
    found.push(notifications(pool, config).await);
    found
}

async fn version(pool: &Store) -> Finding {
    match inspect::server_version(pool).await {
        Ok((text, number)) if number >= OLDEST_TESTED => finding(
            Verdict::Ok,
            "database",
            format!("reachable, PostgreSQL {text}"),
        ),
        Ok((text, _)) => finding(
            Verdict::Warn,
            "database",
            format!("reachable, PostgreSQL {text}: outboxd is tested on 15 and 18"),
        ),
        Err(e) => finding(Verdict::Fail, "database", e.to_string()),
    }
}

async fn open_transaction(pool: &Store, long: Duration) -> Finding {
    match inspect::oldest_transaction(pool).await {
        Ok(Some(open)) if open.age_seconds >= long.as_secs_f64() => finding(
            Verdict::Warn,
            "open transaction",
            format!(
                "pid {} ({}, user {}, application {:?}) has had a transaction open for {}s: vacuum cannot remove what was sent since; end it with SELECT pg_terminate_backend({}) once its owner agrees",
                open.pid,
                open.state.as_deref().unwrap_or("state unknown"),
                open.user.as_deref().unwrap_or("unknown"),
                open.application.as_deref().unwrap_or(""),
                open.age_seconds.round(),
                open.pid,
            ),
        ),
        Ok(_) => finding(
            Verdict::Ok,
            "open transaction",
            format!("none open for {}s or more", long.as_secs()),
        ),
        Err(e) => finding(Verdict::Fail, "open transaction", e.to_string()),
    }
}

async fn vacuum(pool: &Store) -> Finding {
    match inspect::table_health(pool).await {
        Ok(table) if !table.autovacuum_on => finding(
            Verdict::Warn,
            "vacuum",
            format!(
                "autovacuum is off for outbox_messages ({} dead tuples): turn it on, or vacuum it yourself",
                table.dead_tuples
            ),
        ),
        Ok(table) => finding(
            Verdict::Ok,
            "vacuum",
            format!(
                "{} live and {} dead tuples, last autovacuum {}",
                table.live_tuples,
                table.dead_tuples,
                table
                    .last_autovacuum
                    .map_or_else(|| "never".to_owned(), |at| at.to_rfc3339()),
            ),
        ),
        Err(e) => finding(Verdict::Fail, "vacuum", e.to_string()),
    }
}

async fn notifications(pool: &Store, config: &RunConfig) -> Finding {
    let direct = match config.database.listen_options() {
        Some(direct) => match store::connect(direct, 1).await {
            Ok(direct) => Some(pool.on(direct)),
            Err(e) => {
                return finding(
                    Verdict::Fail,
                    "notifications",
                    format!(
                        "OUTBOXD_LISTEN_DATABASE_URL: {}",
                        store::connect_error(e, direct)
                    ),
                );
            }
        },
        None => match store::transaction_pooler_in_the_way(config.database.options()).await {
            Ok(true) => {
                return finding(
                    Verdict::Warn,
                    "notifications",
                    "a transaction pooler is in the way of DATABASE_URL: outboxd will poll every 2s; set OUTBOXD_LISTEN_DATABASE_URL to a direct connection",
                );
            }
            Ok(false) => None,
            Err(e) => return finding(Verdict::Fail, "notifications", e.to_string()),
        },
    };
    let listen_on = direct.as_ref().unwrap_or(pool);
    let back = store::notification_round_trip(pool, listen_on).await;
    if let Some(direct) = direct {
        direct.close().await;
    }
    match back {
        Ok(true) => finding(
            Verdict::Ok,
            "notifications",
            "a NOTIFY comes back on the LISTEN connection",
        ),
        Ok(false) => finding(
            Verdict::Fail,
            "notifications",
            "a NOTIFY did not come back within 2s: commits would wait for the poll",
        ),
        Err(e) => finding(Verdict::Fail, "notifications", e.to_string()),
    }
}
