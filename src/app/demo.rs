//! `outboxd demo`: a database (a throwaway cluster where none answers), three sample emails,
//! and a running dispatcher.

use anyhow::Context as _;
use serde_json::json;
use tracing::info;

use super::{App, DemoCluster};
use crate::config::RunConfig;
use crate::message::{InvalidMessage, NewMessage};
use crate::store;

/// The demo's own PostgreSQL, when none answers at its default address: a throwaway
/// cluster from the server binaries installed here (or why there can be none).
pub async fn demo_database() -> anyhow::Result<Option<DemoCluster>> {
    let options: sqlx::postgres::PgConnectOptions = crate::config::DEFAULT_DATABASE_URL.parse()?;
    if store::answers(&options).await {
        return Ok(None);
    }
    let mut cluster = DemoCluster::start()?;
    cluster.ready().await?;
    Ok(Some(cluster))
}

/// `outboxd demo`: a migrated database, three sample emails, and a running dispatcher.
pub async fn demo(config: RunConfig) -> anyhow::Result<()> {
    let database = &config.database;
    let pool = store::migrate_database(
        database.options(),
        database.schema(),
        store::Create::IfMissing,
    )
    .await?;
    for message in sample_messages()? {
        let kind = message.kind().clone();
        let id = pool
            .enqueue_alone(message)
            .await
            .with_context(|| format!("could not enqueue the sample {kind}"))?;
        info!(outbox.id = id, outbox.kind = %kind, "enqueued a sample message");
    }
    pool.close().await;
    App::build(config).await?.run().await
}

/// One message of each kind the first application sends.
pub fn sample_messages() -> Result<Vec<NewMessage>, InvalidMessage> {
    [
        (
            "account_verification",
            json!({"to": "Ada Lovelace <ada@example.com>", "name": "Ada",
                   "verify_url": "https://app.example.com/verify?token=demo"}),
        ),
        (
            "workspace_invite",
            json!({"to": "grace@example.com", "inviter_name": "Ada Lovelace",
                   "workspace_name": "Analytical Engines",
                   "accept_url": "https://app.example.com/invites/demo"}),
        ),
        (
            "invoice_notice",
            json!({"to": ["billing@example.com"], "cc": "ada@example.com",
                   "customer_name": "Analytical Engines Ltd", "invoice_number": "INV-2026-0042",
                   "amount": "1,250.00", "currency": "EUR", "due_date": "2026-12-31",
                   "invoice_url": "https://app.example.com/invoices/INV-2026-0042"}),
        ),
    ]
    .into_iter()
    .map(|(kind, payload)| NewMessage::new(kind, payload))
    .collect()
}
