//! The database pools a replica opens, and how: directly, or through a transaction pooler
//! (found at start, or said by `OUTBOXD_LISTEN_DATABASE_URL`), where no statement may
//! stay prepared and no LISTEN may be made.

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use tracing::warn;

use crate::config::DatabaseConfig;
use crate::store::{self, Preparing, SchemaFit, Store};

/// Connections the dispatcher uses at once: the LISTEN connection, and up to three
/// statements while a drain overlaps a batch's outcomes, the previous batch's last ones
/// and the next claim (one of them on the connection it keeps between statements).
const POOL_SIZE: u32 = 4;
/// Connections for the admin surface and retention: a pool of their own, so that no HTTP
/// request can take the dispatcher's.
const SURFACE_POOL_SIZE: u32 = 2;
/// Connections for readiness, so that a busy admin page or a long retention pass cannot
/// make a replica unready.
const HEALTH_POOL_SIZE: u32 = 1;
/// Connections for the sampler, apart from readiness's: its gauges walk every pending
/// entry, and under a transaction left open elsewhere (which keeps vacuum from removing
/// what was sent) a sample grows by about 18 ms a minute at 200 messages a second
/// (BENCHMARKS.md). Sharing readiness's connection, hours of that made readiness time out.
const SAMPLE_POOL_SIZE: u32 = 1;
/// Connections for recipient lookups (`store::messages::by_recipient`): apart from the
/// admin surface's, through which the webhooks record what providers report, so that
/// lookups over a long backlog (bounded, but seconds each) never make a provider's
/// notification wait. A lookup that finds both busy is told so at once.
const LOOKUP_POOL_SIZE: u32 = 2;

/// A replica's pools, each a store: one rendering of the statements, on each pool.
pub struct Pools {
    /// The dispatcher's connections.
    pub dispatch: Store,
    /// The admin surface's and retention's: see [`SURFACE_POOL_SIZE`].
    pub surface: Store,
    /// Readiness's: see [`HEALTH_POOL_SIZE`].
    pub health: Store,
    /// The sampler's: see [`SAMPLE_POOL_SIZE`].
    pub sample: Store,
    /// Recipient lookups': see [`LOOKUP_POOL_SIZE`].
    pub lookup: Store,
    /// Where the dispatcher listens: `OUTBOXD_LISTEN_DATABASE_URL`'s own connection, the
    /// dispatcher's pool, or nowhere past a transaction pooler.
    pub listen: Option<Store>,
}

impl Pools {
    /// Opens every pool, and the dispatcher's first, checking the schema on it.
    pub async fn open(database: &DatabaseConfig) -> anyhow::Result<Self> {
        let options = database.options();
        let failed = |e| store::connect_error(e, options);
        let (direct, pooled) = route(database).await?;
        let preparing = if pooled {
            Preparing::Never
        } else {
            Preparing::Kept
        };
        let open = |size| open_pool(options, size, pooled);
        let sizes = Sizes::within(database.max_connections(), direct.is_some());
        let dispatch = open(sizes.dispatch).await.map_err(failed)?;
        let dispatch = Store::new(dispatch, database.schema(), preparing)?;
        let listen = match (direct, pooled) {
            (Some(direct), _) => Some(dispatch.on(direct)),
            (None, false) => Some(dispatch.clone()),
            (None, true) => None,
        };
        if let SchemaFit::Newer { applied, expected } = store::check_schema(&dispatch).await? {
            warn!(
                schema.applied = applied,
                schema.expected = expected,
                "the outbox schema is newer than this outboxd: running beside a newer release \
                 (a rolling upgrade, or one rolled back)"
            );
        }
        let open = async |size| -> anyhow::Result<Store> {
            Ok(dispatch.on(open(size).await.map_err(failed)?))
        };
        let (surface, health, sample, lookup) = match sizes.side {
            Side::Apart => (
                open(SURFACE_POOL_SIZE).await?,
                open(HEALTH_POOL_SIZE).await?,
                open(SAMPLE_POOL_SIZE).await?,
                open(LOOKUP_POOL_SIZE).await?,
            ),
            Side::Shared { size, lookup_apart } => {
                let shared = open(size).await?;
                let lookup = if lookup_apart {
                    open(1).await?
                } else {
                    shared.clone()
                };
                (shared.clone(), shared.clone(), shared, lookup)
            }
        };
        Ok(Self {
            listen,
            surface,
            health,
            sample,
            lookup,
            dispatch,
        })
    }

    /// Closes every pool.
    pub async fn close(&self) {
        let pools = [
            &self.dispatch,
            &self.surface,
            &self.health,
            &self.sample,
            &self.lookup,
        ];
        for pool in pools.into_iter().chain(self.listen.as_ref()) {
            pool.close().await;
        }
    }
}

/// How the replica reaches the database: the direct LISTEN connection
/// (`OUTBOXD_LISTEN_DATABASE_URL`), if any, and whether a transaction pooler is in the way
/// of `DATABASE_URL`.
async fn route(database: &DatabaseConfig) -> anyhow::Result<(Option<PgPool>, bool)> {
    let options = database.options();
    store::reachable(options)
        .await
        .map_err(|e| store::connect_error(e, options))?;
    if let Some(direct) = database.listen_options() {
        let listen = store::connect(direct, 1)
            .await
            .map_err(|e| store::connect_error(e, direct))?;
        return Ok((Some(listen), true));
    }
    let pooled = store::transaction_pooler_in_the_way(options)
        .await
        .map_err(|e| store::connect_error(e, options))?;
    if pooled {
        warn!(
            "a transaction pooler is in the way of DATABASE_URL: notifications do not come back through it, so outboxd does not LISTEN there and polls every 2s, and keeps no statement prepared; set OUTBOXD_LISTEN_DATABASE_URL to a direct connection for LISTEN"
        );
    }
    Ok((None, pooled))
}

/// How many connections each pool may open.
#[derive(Debug, PartialEq, Eq)]
struct Sizes {
    /// The dispatcher's, its LISTEN connection included unless it listens elsewhere.
    dispatch: u32,
    side: Side,
}

/// The admin surface's, readiness's, the sampler's and the lookups' pools.
#[derive(Debug, PartialEq, Eq)]
enum Side {
    /// Each of its own: nothing one does can take another's connection.
    Apart,
    /// Under a connection budget: one pool of this size shared by the admin surface,
    /// readiness and the sampler, and the lookups' own connection when `lookup_apart`
    /// (the budget leaves the shared pool 2 or more), else the lookups share it too.
    Shared { size: u32, lookup_apart: bool },
}

impl Sizes {
    /// Today's pools, or, under `budget`, pools that together with the connection a write
    /// waiting on row locks opens (`store::record_outcomes_when_unlocked`) and the direct
    /// LISTEN connection, if any, open no more than it: the dispatcher's first, up to
    /// [`POOL_SIZE`], and the rest shared by the others.
    fn within(budget: Option<u32>, listens_elsewhere: bool) -> Self {
        let elsewhere = u32::from(listens_elsewhere);
        // The direct LISTEN connection takes the dispatcher's LISTEN slot.
        let apart = POOL_SIZE
            + SURFACE_POOL_SIZE
            + HEALTH_POOL_SIZE
            + SAMPLE_POOL_SIZE
            + LOOKUP_POOL_SIZE
            + 1;
        match budget {
            Some(budget) if budget < apart => {
                // Checked at start: at least MIN_CONNECTIONS, so that what is left after the
                // lock waiter's and a direct LISTEN connection holds the dispatcher's LISTEN
                // connection (when it listens there), one for its statements, and one shared.
                let left = budget.saturating_sub(1 + elsewhere);
                let dispatch = (POOL_SIZE - elsewhere).min(left.saturating_sub(1)).max(1);
                let side = left.saturating_sub(dispatch).max(1);
                let lookup_apart = side >= 2;
                Self {
                    dispatch,
                    side: Side::Shared {
                        size: side - u32::from(lookup_apart),
                        lookup_apart,
                    },
                }
            }
            _ => Self {
                dispatch: POOL_SIZE - elsewhere,
                side: Side::Apart,
            },
        }
    }

    /// What these pools open at most, the lock waiter's connection and a direct LISTEN
    /// connection included.
    #[cfg(test)]
    fn total(&self, listens_elsewhere: bool) -> u32 {
        let side = match self.side {
            Side::Apart => {
                SURFACE_POOL_SIZE + HEALTH_POOL_SIZE + SAMPLE_POOL_SIZE + LOOKUP_POOL_SIZE
            }
            Side::Shared { size, lookup_apart } => size + u32::from(lookup_apart),
        };
        self.dispatch + side + 1 + u32::from(listens_elsewhere)
    }
}

async fn open_pool(
    options: &PgConnectOptions,
    size: u32,
    pooled: bool,
) -> Result<PgPool, sqlx::Error> {
    if pooled {
        store::connect_pooled(options, size).await
    } else {
        store::connect(options, size).await
    }
}

/// A pool for one command of the command line, checked for the schema. It keeps no
/// statement prepared: a command runs few, and it may go through a transaction pooler.
pub async fn connect_checked(database: &DatabaseConfig) -> anyhow::Result<Store> {
    let size = database
        .max_connections()
        .map_or(POOL_SIZE, |max| max.min(POOL_SIZE));
    let pool = store::connect_pooled(database.options(), size)
        .await
        .map_err(|e| store::connect_error(e, database.options()))?;
    let store = Store::new(pool, database.schema(), Preparing::Never)?;
    store::check_schema(&store).await?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::{Side, Sizes};
    use crate::config::MIN_CONNECTIONS;

    #[test]
    fn no_budget_keeps_the_pools_apart() {
        for elsewhere in [false, true] {
            let sizes = Sizes::within(None, elsewhere);
            assert_eq!(sizes.side, Side::Apart);
            assert_eq!(sizes.total(elsewhere), 11);
        }
    }

    #[test]
    fn every_budget_from_the_smallest_is_kept_with_room_for_each_pool() {
        for elsewhere in [false, true] {
            for budget in MIN_CONNECTIONS..=14 {
                let sizes = Sizes::within(Some(budget), elsewhere);
                assert!(sizes.total(elsewhere) <= budget, "{budget}: {sizes:?}");
                // The dispatcher's LISTEN connection and one for its statements.
                let listener = u32::from(!elsewhere);
                assert!(sizes.dispatch > listener, "{budget}: {sizes:?}");
                if let Side::Shared { size, lookup_apart } = sizes.side {
                    assert!(size >= 1, "{budget}: {sizes:?}");
                    // Lookups are apart from the webhooks from a budget of 7 on.
                    assert_eq!(lookup_apart, budget >= 7, "{budget}");
                }
            }
        }
    }
}
