//! The installation's tag (migration 23), read once at start for the Message-IDs.

use super::statement::Sql;
use super::statements::Store;
use crate::message::InstallationTag;

/// This database's installation tag.
pub async fn tag(store: &Store) -> anyhow::Result<InstallationTag> {
    let text: String = store
        .scalar(store.query_scalar(Sql::InstallationTag))
        .await?;
    InstallationTag::parse(&text).map_err(anyhow::Error::msg)
}
