//! The installation's tag (migration 23), read once at start for the Message-IDs.

use super::statement::Sql;
use super::statements::Store;
use crate::message::InstallationTag;

/// This database's installation tag.
pub async fn tag(store: &Store) -> anyhow::Result<InstallationTag> {
    let text: String = store
        .alone(async |c| store.query_scalar(Sql::InstallationTag).fetch_one(c).await)
        .await?;
    InstallationTag::parse(&text).map_err(anyhow::Error::msg)
}
