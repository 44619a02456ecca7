//! Every statement outboxd sends, by name ([`Sql`]): the blocks of the `.sql` files in
//! `src/store/sql/`, one file per table or concern. A block starts with `-- name: NAME`
//! (or `-- fragment: NAME`, a predicate or column list that several statements include),
//! then a header of comment lines: what the statement is for and why it is shaped so,
//! each parameter (`$1 limit (bigint): ...`), and the index it relies on. The text marks
//! each of outboxd's objects with `{{schema}}` and includes a fragment with `{{NAME}}`
//! (`outboxd_producer::template`); a stored word is written as a literal followed by the
//! Rust definition it must equal (`'sent' /* word: action.sent */`), which a test checks.
//! A [`super::Store`] renders every statement once, when it is made.

use std::collections::HashMap;
use std::sync::Arc;

use outboxd_producer::Schema;
use outboxd_producer::template::{self, TemplateError};

/// The files, by name, as compiled in.
pub(crate) const FILES: &[(&str, &str)] = &[
    ("fragments", include_str!("sql/fragments.sql")),
    ("admin", include_str!("sql/admin.sql")),
    ("callbacks", include_str!("sql/callbacks.sql")),
    ("cancel", include_str!("sql/cancel.sql")),
    ("circuits", include_str!("sql/circuits.sql")),
    ("claim", include_str!("sql/claim.sql")),
    ("erase", include_str!("sql/erase.sql")),
    ("inspect", include_str!("sql/inspect.sql")),
    ("kind_policies", include_str!("sql/kind_policies.sql")),
    ("installation", include_str!("sql/installation.sql")),
    ("listen", include_str!("sql/listen.sql")),
    ("messages", include_str!("sql/messages.sql")),
    ("migrations", include_str!("sql/migrations.sql")),
    ("outcomes", include_str!("sql/outcomes.sql")),
    ("pauses", include_str!("sql/pauses.sql")),
    ("prune", include_str!("sql/prune.sql")),
    ("sample", include_str!("sql/sample.sql")),
    ("schema_state", include_str!("sql/schema_state.sql")),
    ("send_rate", include_str!("sql/send_rate.sql")),
    ("stats", include_str!("sql/stats.sql")),
    ("suppressions", include_str!("sql/suppressions.sql")),
    ("timeline", include_str!("sql/timeline.sql")),
];

/// A statement, by the name of its block (the variant's name in snake case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Sql {
    ListDeadLetters,
    DeadLetterGroups,
    RetryDeadLetters,
    DiscardDeadLetters,
    WakeDispatchers,
    Audit,
    AuditLog,
    CallbacksSwitched,
    SetCallbacks,
    ClaimCallbacks,
    CallbacksDelivered,
    CallbackFailed,
    SampleCallbacks,
    PruneCallbacks,
    KindPolicies,
    PublishKindPolicies,
    RemoveSentPayloads,
    RemoveDiscardedPayloads,
    PayloadsSwept,
    ErasureMark,
    ErasePending,
    EraseEnded,
    AuditIds,
    EraseAudit,
    ErasePauses,
    MarkSuppressions,
    CancelById,
    CancelByKey,
    CountPending,
    CancelPending,
    CircuitOpened,
    CircuitClosed,
    OpenCircuits,
    Claim,
    ServerVersion,
    OldestTransaction,
    InvalidIndexes,
    TableHealth,
    InstallationTag,
    RunsFromSchema,
    Linger,
    MessageById,
    MessagesByRecipient,
    MessagesByTag,
    MorePendingThan,
    SchemaExists,
    AppliedMigrations,
    LockMigrationsTable,
    MigrationsTables,
    CountOldMigrations,
    CreateMigrationsTable,
    CopyOldMigrations,
    SetSearchPath,
    RecordOutcomes,
    RecordOutcomesSkippingLocked,
    RecordOutcomesWaiting,
    PauseKind,
    ResumeKind,
    ListPauses,
    PauseKindAutomatically,
    ResumedSince,
    RecentSends,
    PruneDispatched,
    PruneDiscarded,
    SampleTotals,
    SampleKinds,
    SamplePaused,
    SampleEvents,
    SchemaState,
    BookSlots,
    StartSchedule,
    HandBackSlots,
    SlowDown,
    StatsPending,
    StatsDeadLetters,
    StatsSentLastHour,
    StatsEndedLastHour,
    SuppressedAmong,
    SuppressedRecipientsOf,
    ListSuppressions,
    GetSuppression,
    RemoveSuppression,
    RemoveLaneSuppressions,
    UpsertSuppression,
    UpsertLaneSuppression,
    FirstReceipt,
    EnvelopeOf,
    MarkFeedback,
    Timelines,
    OperatorActionEvents,
}

impl Sql {
    /// Every statement, in the order of the enum.
    pub(crate) const ALL: &[Sql] = &[
        Sql::ListDeadLetters,
        Sql::DeadLetterGroups,
        Sql::RetryDeadLetters,
        Sql::DiscardDeadLetters,
        Sql::WakeDispatchers,
        Sql::Audit,
        Sql::AuditLog,
        Sql::CallbacksSwitched,
        Sql::SetCallbacks,
        Sql::ClaimCallbacks,
        Sql::CallbacksDelivered,
        Sql::CallbackFailed,
        Sql::SampleCallbacks,
        Sql::PruneCallbacks,
        Sql::KindPolicies,
        Sql::PublishKindPolicies,
        Sql::RemoveSentPayloads,
        Sql::RemoveDiscardedPayloads,
        Sql::PayloadsSwept,
        Sql::ErasureMark,
        Sql::ErasePending,
        Sql::EraseEnded,
        Sql::AuditIds,
        Sql::EraseAudit,
        Sql::ErasePauses,
        Sql::MarkSuppressions,
        Sql::CancelById,
        Sql::CancelByKey,
        Sql::CountPending,
        Sql::CancelPending,
        Sql::CircuitOpened,
        Sql::CircuitClosed,
        Sql::OpenCircuits,
        Sql::Claim,
        Sql::ServerVersion,
        Sql::OldestTransaction,
        Sql::InvalidIndexes,
        Sql::TableHealth,
        Sql::InstallationTag,
        Sql::RunsFromSchema,
        Sql::Linger,
        Sql::MessageById,
        Sql::MessagesByRecipient,
        Sql::MessagesByTag,
        Sql::MorePendingThan,
        Sql::SchemaExists,
        Sql::AppliedMigrations,
        Sql::LockMigrationsTable,
        Sql::MigrationsTables,
        Sql::CountOldMigrations,
        Sql::CreateMigrationsTable,
        Sql::CopyOldMigrations,
        Sql::SetSearchPath,
        Sql::RecordOutcomes,
        Sql::RecordOutcomesSkippingLocked,
        Sql::RecordOutcomesWaiting,
        Sql::PauseKind,
        Sql::ResumeKind,
        Sql::ListPauses,
        Sql::PauseKindAutomatically,
        Sql::ResumedSince,
        Sql::RecentSends,
        Sql::PruneDispatched,
        Sql::PruneDiscarded,
        Sql::SampleTotals,
        Sql::SampleKinds,
        Sql::SamplePaused,
        Sql::SampleEvents,
        Sql::SchemaState,
        Sql::BookSlots,
        Sql::StartSchedule,
        Sql::HandBackSlots,
        Sql::SlowDown,
        Sql::StatsPending,
        Sql::StatsDeadLetters,
        Sql::StatsSentLastHour,
        Sql::StatsEndedLastHour,
        Sql::SuppressedAmong,
        Sql::SuppressedRecipientsOf,
        Sql::ListSuppressions,
        Sql::GetSuppression,
        Sql::RemoveSuppression,
        Sql::RemoveLaneSuppressions,
        Sql::UpsertSuppression,
        Sql::UpsertLaneSuppression,
        Sql::FirstReceipt,
        Sql::EnvelopeOf,
        Sql::MarkFeedback,
        Sql::Timelines,
        Sql::OperatorActionEvents,
    ];

    /// The block's name: `RecordOutcomes` is `record_outcomes`.
    pub(crate) fn name(self) -> String {
        let mut name = String::new();
        for (i, c) in format!("{self:?}").chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_lowercase());
        }
        name
    }
}

/// What a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockKind {
    Statement,
    Fragment,
}

/// One block of a file.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// The file's name, for the tests of the files.
    #[cfg(test)]
    pub(crate) file: &'static str,
    pub(crate) kind: BlockKind,
    pub(crate) name: &'static str,
    /// The header's lines, without their `-- `.
    #[cfg(test)]
    pub(crate) header: Vec<&'static str>,
    /// The text after the header, markers unrendered.
    pub(crate) body: &'static str,
}

/// Every block of every file, in order.
pub(crate) fn blocks() -> Vec<Block> {
    let mut blocks = Vec::new();
    for &(_file, text) in FILES {
        let mut starts: Vec<(usize, BlockKind, &'static str)> = Vec::new();
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            let kinds = [
                ("-- name: ", BlockKind::Statement),
                ("-- fragment: ", BlockKind::Fragment),
            ];
            for (prefix, kind) in kinds {
                if let Some(name) = line.strip_prefix(prefix) {
                    starts.push((at, kind, name.trim()));
                }
            }
            at += line.len();
        }
        for (i, &(start, kind, name)) in starts.iter().enumerate() {
            let end = starts.get(i + 1).map_or(text.len(), |next| next.0);
            let block = &text[start..end];
            let after_name = block.split_once('\n').map_or("", |(_, rest)| rest);
            blocks.push(Block {
                #[cfg(test)]
                file: _file,
                kind,
                name,
                #[cfg(test)]
                header: after_name
                    .lines()
                    .take_while(|line| line.starts_with("--") || line.trim().is_empty())
                    .map(|line| line.trim_start_matches("--").trim())
                    .filter(|line| !line.is_empty())
                    .collect(),
                body: template::body(after_name),
            });
        }
    }
    blocks
}

/// Why the statements could not be rendered: a fault of this build's files, which every
/// test that makes a store would meet.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("statement {0}: {1}")]
    Template(String, TemplateError),
    #[error("no block names the statement {0}")]
    Missing(String),
    #[error("the block {0} names no statement outboxd sends")]
    Unused(String),
}

/// Every statement's text, in the schema, indexed by [`Sql`].
pub(crate) fn render_all(schema: Option<&Schema>) -> Result<Box<[Arc<str>]>, RenderError> {
    let blocks = blocks();
    let fragments: HashMap<&str, &str> = blocks
        .iter()
        .filter(|b| b.kind == BlockKind::Fragment)
        .map(|b| (b.name, b.body))
        .collect();
    let statements: HashMap<&str, &str> = blocks
        .iter()
        .filter(|b| b.kind == BlockKind::Statement)
        .map(|b| (b.name, b.body))
        .collect();
    let include = |name: &str, argument: Option<&str>| {
        let body = fragments.get(name)?;
        Some(match argument {
            Some(argument) => body.replace("{{argument}}", argument),
            None => (*body).to_owned(),
        })
    };
    let names: Vec<String> = Sql::ALL.iter().map(|sql| sql.name()).collect();
    if let Some(unused) = statements.keys().find(|name| !names.iter().any(|n| n == *name)) {
        return Err(RenderError::Unused((*unused).to_owned()));
    }
    names
        .into_iter()
        .map(|name| {
            let body = statements
                .get(name.as_str())
                .ok_or_else(|| RenderError::Missing(name.clone()))?;
            template::render_with(body, schema, &include)
                .map(Arc::from)
                .map_err(|e| RenderError::Template(name, e))
        })
        .collect()
}

#[cfg(test)]
#[path = "statement_tests.rs"]
mod tests;
