//! The label values of outboxd's metrics that are not the domain's words (those live with
//! their types: `FailureType`, `ReleaseReason`, `SuppressionReason`, ...), each with the
//! `ALL` list that pre-registers it at 0.

/// The `result` label of `outbox_webhook_requests_total`: accepted, or why it was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookResult {
    Accepted,
    /// Credentials or signature missing or wrong.
    Unauthorized,
    /// Not the provider's format, or a notification this endpoint does not take.
    Invalid,
    /// Over the size limit.
    TooLarge,
    /// Could not be recorded (database) or checked (the signing certificate).
    Failed,
}

impl WebhookResult {
    pub const ALL: [WebhookResult; 5] = [
        WebhookResult::Accepted,
        WebhookResult::Unauthorized,
        WebhookResult::Invalid,
        WebhookResult::TooLarge,
        WebhookResult::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WebhookResult::Accepted => "accepted",
            WebhookResult::Unauthorized => "unauthorized",
            WebhookResult::Invalid => "invalid",
            WebhookResult::TooLarge => "too_large",
            WebhookResult::Failed => "failed",
        }
    }
}

/// What became of a recipient lookup: the `result` label of
/// `outbox_recipient_lookups_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    Answered,
    /// Every connection for lookups was in use: refused at once.
    Busy,
    /// The server stopped it at its statement timeout.
    TimedOut,
    /// The database failed otherwise.
    Failed,
}

impl LookupResult {
    pub const ALL: [LookupResult; 4] = [
        LookupResult::Answered,
        LookupResult::Busy,
        LookupResult::TimedOut,
        LookupResult::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LookupResult::Answered => "answered",
            LookupResult::Busy => "busy",
            LookupResult::TimedOut => "timed_out",
            LookupResult::Failed => "failed",
        }
    }
}

/// What became of a one-click unsubscribe request: the `result` label of
/// `outbox_unsubscribes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsubscribeResult {
    /// The address is suppressed for the link's scope now.
    Recorded,
    /// It was already: nothing changed.
    AlreadyRecorded,
    /// Not a link outboxd made, not RFC 8058's body, or too large.
    Refused,
    /// Could not be recorded now (the database, or too many at once); the sender retries.
    Failed,
}

impl UnsubscribeResult {
    pub const ALL: [UnsubscribeResult; 4] = [
        UnsubscribeResult::Recorded,
        UnsubscribeResult::AlreadyRecorded,
        UnsubscribeResult::Refused,
        UnsubscribeResult::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UnsubscribeResult::Recorded => "recorded",
            UnsubscribeResult::AlreadyRecorded => "already_recorded",
            UnsubscribeResult::Refused => "refused",
            UnsubscribeResult::Failed => "failed",
        }
    }
}

/// What became of a message the bounce listener took (`OUTBOXD_BOUNCE_LISTEN`): the
/// `result` label of `outbox_bounce_listener_messages_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DsnResult {
    /// A DSN about our message: its recipients' bounces recorded.
    Recorded,
    /// The same DSN again: nothing changed.
    Replay,
    /// Not a DSN (an auto-reply, a human's answer) or one that reports no failure: nothing
    /// recorded.
    NotABounce,
    /// Sent to a return path outboxd did not make: nothing recorded.
    Forged,
    /// Over the size limit: refused (552).
    TooLarge,
    /// Could not be recorded now (the database): refused with a 451, the sender retries.
    Failed,
}

impl DsnResult {
    pub const ALL: [DsnResult; 6] = [
        DsnResult::Recorded,
        DsnResult::Replay,
        DsnResult::NotABounce,
        DsnResult::Forged,
        DsnResult::TooLarge,
        DsnResult::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DsnResult::Recorded => "recorded",
            DsnResult::Replay => "replay",
            DsnResult::NotABounce => "not_a_bounce",
            DsnResult::Forged => "forged",
            DsnResult::TooLarge => "too_large",
            DsnResult::Failed => "failed",
        }
    }
}

/// The `kind` label of a kind outboxd has no templates for: keeps the label set bounded.
pub const OTHER_KIND: &str = "other";

/// A database operation: the `operation` label of `outbox_database_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseOperation {
    Claim,
    Record,
    Listen,
    Sample,
    Readiness,
    Prune,
    AutoPause,
    /// The callback sender's claims and records.
    Callbacks,
}

impl DatabaseOperation {
    pub const ALL: [DatabaseOperation; 8] = [
        DatabaseOperation::Claim,
        DatabaseOperation::Record,
        DatabaseOperation::Listen,
        DatabaseOperation::Sample,
        DatabaseOperation::Readiness,
        DatabaseOperation::Prune,
        DatabaseOperation::AutoPause,
        DatabaseOperation::Callbacks,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DatabaseOperation::Claim => "claim",
            DatabaseOperation::Record => "record",
            DatabaseOperation::Listen => "listen",
            DatabaseOperation::Sample => "sample",
            DatabaseOperation::Readiness => "readiness",
            DatabaseOperation::Prune => "prune",
            DatabaseOperation::AutoPause => "auto_pause",
            DatabaseOperation::Callbacks => "callbacks",
        }
    }
}

/// A task beside the dispatcher: the `task` label of `outbox_background_task_restarts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundTask {
    Sampler,
    Retention,
    RecorderUpkeep,
    AutoPause,
    /// The delivery callbacks' sender.
    Callbacks,
}

impl BackgroundTask {
    pub const ALL: [BackgroundTask; 5] = [
        BackgroundTask::Sampler,
        BackgroundTask::Retention,
        BackgroundTask::RecorderUpkeep,
        BackgroundTask::AutoPause,
        BackgroundTask::Callbacks,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackgroundTask::Sampler => "sampler",
            BackgroundTask::Retention => "retention",
            BackgroundTask::RecorderUpkeep => "recorder_upkeep",
            BackgroundTask::AutoPause => "auto_pause",
            BackgroundTask::Callbacks => "callbacks",
        }
    }
}

/// Why a callback's POST failed: the `reason` label of `outbox_callback_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackFailure {
    /// No answer: the endpoint could not be reached, or did not answer in time.
    Unreachable,
    /// The endpoint answered, with a status other than 2xx.
    Refused,
}

impl CallbackFailure {
    pub const ALL: [CallbackFailure; 2] = [CallbackFailure::Unreachable, CallbackFailure::Refused];

    pub fn as_str(self) -> &'static str {
        match self {
            CallbackFailure::Unreachable => "unreachable",
            CallbackFailure::Refused => "refused",
        }
    }
}
