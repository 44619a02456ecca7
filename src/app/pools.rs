//! The database pools a replica opens, and how: directly, or through a transaction pooler
//! (found at start, or said by `OUTBOXD_LISTEN_DATABASE_URL`), where no statement may
//! stay prepared and no LISTEN may be made.

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use tracing::warn;

use crate::config::DatabaseConfig;
use crate::store;

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

/// A replica's pools.
pub struct Pools {
    /// The dispatcher's connections.
    pub dispatch: PgPool,
    /// The admin surface's and retention's: see [`SURFACE_POOL_SIZE`].
    pub surface: PgPool,
    /// Readiness's: see [`HEALTH_POOL_SIZE`].
    pub health: PgPool,
    /// The sampler's: see [`SAMPLE_POOL_SIZE`].
    pub sample: PgPool,
    /// Where the dispatcher listens: `OUTBOXD_LISTEN_DATABASE_URL`'s own connection, the
    /// dispatcher's pool, or nowhere past a transaction pooler.
    pub listen: Option<PgPool>,
}

impl Pools {
    /// Opens every pool, and the dispatcher's first, checking the schema on it.
    pub async fn open(database: &DatabaseConfig) -> anyhow::Result<Self> {
        let options = database.options();
        let failed = |e| store::connect_error(e, options);
        let (direct, pooled) = match database.listen_options() {
            Some(direct) => {
                let listen = store::connect(direct, 1)
                    .await
                    .map_err(|e| store::connect_error(e, direct))?;
                (Some(listen), true)
            }
            None => {
                let pooled = store::transaction_pooler_in_the_way(options)
                    .await
                    .map_err(failed)?;
                if pooled {
                    warn!(
                        "a transaction pooler is in the way of DATABASE_URL: notifications do not come back through it, so outboxd does not LISTEN there and polls every 2s, and keeps no statement prepared; set OUTBOXD_LISTEN_DATABASE_URL to a direct connection for LISTEN"
                    );
                }
                (None, pooled)
            }
        };
        if pooled {
            store::keep_no_statement_prepared();
        }
        let open = |size| open_pool(options, size, pooled);
        let dispatch = open(POOL_SIZE).await.map_err(failed)?;
        store::check_schema(&dispatch).await?;
        let listen = match (direct, pooled) {
            (Some(direct), _) => Some(direct),
            (None, false) => Some(dispatch.clone()),
            (None, true) => None,
        };
        Ok(Self {
            listen,
            surface: open(SURFACE_POOL_SIZE).await.map_err(failed)?,
            health: open(HEALTH_POOL_SIZE).await.map_err(failed)?,
            sample: open(SAMPLE_POOL_SIZE).await.map_err(failed)?,
            dispatch,
        })
    }

    /// Closes every pool.
    pub async fn close(&self) {
        let pools = [&self.dispatch, &self.surface, &self.health, &self.sample];
        for pool in pools.into_iter().chain(self.listen.as_ref()) {
            pool.close().await;
        }
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
pub async fn connect_checked(database: &DatabaseConfig) -> anyhow::Result<PgPool> {
    store::keep_no_statement_prepared();
    let pool = store::connect_pooled(database.options(), POOL_SIZE)
        .await
        .map_err(|e| store::connect_error(e, database.options()))?;
    store::check_schema(&pool).await?;
    Ok(pool)
}
