//! Every SQL statement outboxd issues. Nothing else in the crate speaks SQL.
//!
//! The statements are the blocks of the `.sql` files in `sql/` ([`statement`]), rendered
//! once into a [`Store`], the one value through which the rest of the crate reaches the
//! database.

mod rights;
mod statement;
mod statements;

pub mod admin;
pub mod callbacks;
pub mod cancel;
pub mod circuits;
mod claim;
mod connect;
pub mod erase;
pub mod inspect;
pub mod installation;
mod kept;
pub mod kind_policies;
mod listen;
pub mod messages;
mod migrations;
mod outcomes;
pub mod pauses;
pub mod prune;
mod sample;
mod schema_state;
pub mod send_rate;
pub mod stats;
pub mod suppressions;
pub mod timeline;

pub use claim::{ClaimRequest, Claimed, claim};
pub use connect::{
    Create, answers, connect, connect_error, connect_pooled, location, migrate_database, reachable,
};
pub use kept::KeptConnection;
pub use listen::{
    CHECK_CHANNEL, linger, listen, notification_round_trip, send_check,
    transaction_pooler_in_the_way,
};
pub use outboxd_producer::Schema;
pub use outcomes::{
    OutcomeRow, Recorded, RowLocks, record_outcomes, record_outcomes_when_unlocked,
};
pub use prune::Prunable;
pub use rights::Rights;
#[cfg(feature = "testing")]
pub use rights::{AUTO_PAUSE_RIGHTS, CALLBACK_RIGHTS, PAYLOAD_RETENTION_RIGHTS, RUN_RIGHTS, Right};
pub use sample::{Sample, sample};
pub use schema_state::{SchemaError, SchemaFit, check_ready, check_schema};
pub use statement::RenderError;
pub use statements::{Preparing, Store};

pub use migrations::MIGRATOR;
#[cfg(feature = "testing")]
pub use migrations::{MIGRATIONS_TABLE, migrate};

/// The outbox table.
pub const TABLE: &str = "outbox_messages";

/// The most rows one page of a listing returns (dead letters, the suppression list), for
/// the API's and the command line's `limit`.
pub const MAX_PAGE: i64 = 500;

/// Where the next page of a listing starts: the key of a full page's last row (a page is
/// full when it holds `limit` rows); none after a short one. Every listing pages so.
pub fn next_after<T, K>(page: &[T], limit: i64, key: impl FnOnce(&T) -> K) -> Option<K> {
    let full = i64::try_from(page.len()).unwrap_or(i64::MAX) >= limit;
    page.last().filter(|_| full).map(key)
}

/// The channel the insert trigger notifies at commit.
pub const NOTIFY_CHANNEL: &str = "outbox_messages";

/// Errors of the producer API: the producer crate's.
pub use outboxd_producer::EnqueueError;
