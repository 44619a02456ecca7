//! `outboxd erase --recipient ADDRESS`: what outboxd keeps of an address replaced by its
//! one-way mark (GDPR article 17), directly in the database, audited under the mark.

use clap::Args;

use super::{Output, cli_actor, with_database};
use crate::config::DatabaseArgs;
use crate::store::erase::{self, SuppressionChoice};
use crate::suppression::Address;

#[derive(Debug, Args)]
pub struct EraseArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The address to erase: its pending messages are cancelled, the payloads of its
    /// messages removed, and the address replaced by a one-way mark in outboxd's tables.
    #[arg(long, value_parser = Address::parse)]
    pub recipient: Address,
    /// Move the address's suppression list entries to its mark (the claim still honours
    /// them) instead of keeping them as they are: an address that opted out stays opted out
    /// either way.
    #[arg(long)]
    pub mark_suppression: bool,
    /// Erase: it cannot be undone. Without it, nothing changes.
    #[arg(long)]
    pub yes: bool,
}

/// Checks the arguments, then erases in the database they name.
pub(super) async fn command(args: EraseArgs) -> anyhow::Result<()> {
    if !args.yes {
        anyhow::bail!("an erasure cannot be undone: run again with --yes to erase this address");
    }
    let choice = if args.mark_suppression {
        SuppressionChoice::Mark
    } else {
        SuppressionChoice::Keep
    };
    with_database(&args.database, Output::ForPeople, async |pool| {
        let erased = erase::erase(pool, &args.recipient, choice, &cli_actor()).await?;
        outln!("erased; the address is now {}", erased.mark)?;
        outln!("pending messages cancelled: {}", erased.pending_cancelled)?;
        outln!("ended messages erased: {}", erased.messages_erased)?;
        outln!("audit entries and pauses rewritten: {}", erased.audit_entries)?;
        outln!("longest transaction: {} ms", erased.longest_transaction_ms)?;
        outln!(
            "suppression list: {}",
            if erased.suppressions_marked > 0 {
                format!("{} entries moved to the mark", erased.suppressions_marked)
            } else {
                "kept as it was".to_owned()
            }
        )?;
        if erased.in_flight > 0 {
            eprintln!(
                "warning: {} messages were being sent: run the erasure again once their sends end (within the lease) to erase them too",
                erased.in_flight
            );
        }
        Ok(())
    })
    .await
}
