//! Why templates cannot be loaded, and why a message cannot be rendered: each with the
//! short, stable class its dead letters are grouped by.

/// Why the templates could not be loaded at start-up.
#[derive(Debug, thiserror::Error)]
pub enum TemplateLoadError {
    #[error("cannot read templates directory {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("template {name} does not parse: {}", describe_at(source))]
    Syntax {
        name: String,
        source: minijinja::Error,
    },
    #[error("template directory {0}: {1}")]
    Layout(String, String),
}

/// Why a message cannot be rendered. All of these are permanent: the same payload
/// will fail the same way every time, so the row is dead-lettered at once.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    #[error("unknown kind {0:?}: no templates for it")]
    UnknownKind(String),
    #[error("payload does not render: {0}")]
    Template(String),
    #[error("invalid address in {field}: {reason}")]
    Address { field: &'static str, reason: String },
    #[error("refused header injection: {0} contains a line break or another control character")]
    HeaderInjection(&'static str),
    #[error("cannot build the email: {0}")]
    Build(String),
    /// The row's payload cannot be read at all (see [`crate::message::ClaimedPayload`]).
    #[error("{0}")]
    Payload(String),
    #[error(
        "{count} addresses in to, cc, bcc and reply_to: more than the limit of {max} (OUTBOXD_MAX_RECIPIENTS)"
    )]
    TooManyRecipients { count: usize, max: usize },
    #[error("the email is {bytes} bytes: more than the limit of {max} (OUTBOXD_MAX_MESSAGE_BYTES)")]
    TooLarge { bytes: usize, max: usize },
    /// A header the kind declares, or an attachment, that cannot go into the email.
    #[error("{what} {reason}")]
    Declared {
        what: String,
        reason: String,
        class: &'static str,
    },
    #[error(
        "the attachments are {bytes} bytes: more than the limit of {max} (OUTBOXD_MAX_ATTACHMENT_BYTES)"
    )]
    AttachmentsTooLarge { bytes: usize, max: usize },
}

impl RenderError {
    /// A short, stable name for grouping dead letters.
    pub fn error_class(&self) -> &'static str {
        match self {
            RenderError::UnknownKind(_) => "unknown_kind",
            RenderError::Template(_) | RenderError::Build(_) => "render",
            RenderError::Address { .. } => "address",
            RenderError::HeaderInjection(_) => "header_injection",
            RenderError::Payload(_) => "payload",
            RenderError::TooManyRecipients { .. } => "too_many_recipients",
            RenderError::TooLarge { .. } => "too_large",
            RenderError::Declared { class, .. } => class,
            RenderError::AttachmentsTooLarge { .. } => "attachment_too_large",
        }
    }
}

pub(super) fn describe_at(error: &minijinja::Error) -> String {
    match error.line() {
        Some(line) => format!("{} on line {line}", describe(error)),
        None => describe(error),
    }
}

/// minijinja's error with its detail but without the multi-line source excerpt.
pub(super) fn describe(error: &minijinja::Error) -> String {
    match error.detail() {
        Some(detail) => format!("{} ({detail})", error.kind()),
        None => error.kind().to_string(),
    }
}
