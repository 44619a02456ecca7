//! The installation's tag (migration 23), read once at start for the Message-IDs.

use sqlx::PgPool;

use super::statements::{on_its_own, query_scalar};
use crate::message::InstallationTag;

/// This database's installation tag.
pub async fn tag(pool: &PgPool) -> anyhow::Result<InstallationTag> {
    let mut connection = pool.acquire().await?;
    let text: String = on_its_own(&mut connection, async |c| {
        query_scalar("SELECT tag FROM outbox_installation")
            .fetch_one(c)
            .await
    })
    .await?;
    InstallationTag::parse(&text).map_err(anyhow::Error::msg)
}
