//! outboxd: a transactional-outbox email dispatcher for PostgreSQL.
//!
//! Applications insert a row into `outbox_messages` in the same transaction as their
//! business change (the `outboxd-producer` crate does it from Rust); outboxd claims due
//! rows, renders them into emails, sends them over SMTP and records the outcome.
//! `ARCHITECTURE.md` orders the modules in layers, from the wiring down to the domain: each
//! uses only those below it.
//!
//! The public API is small: [`main`], what the binary runs; [`Store`], through which an
//! application that embeds outboxd enqueues in outboxd's schema and route; and
//! [`NewMessage`]. The modules are outboxd's own: crate-private, so that rustc reports
//! what nothing uses, and public only to outboxd's integration tests, which turn on the
//! `testing` feature.

// Functions fit on a screen (60 lines, clippy.toml); a longer one states why with
// `#[expect(clippy::too_many_lines, reason = "...")]`. Test scenarios are exempt.
#![warn(clippy::too_many_lines)]

/// Declares outboxd's modules: `pub` with the `testing` feature, `pub(crate)` without.
macro_rules! modules {
    ($($module:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $module;
        #[cfg(not(feature = "testing"))]
        pub(crate) mod $module;
    )*};
}

modules!(
    app,
    background,
    backlog,
    bounces,
    callbacks,
    cli,
    config,
    dispatch,
    doctor,
    feedback,
    http,
    http_client,
    lane,
    lock,
    mailer,
    message,
    render,
    report,
    store,
    suppression,
    telemetry,
    text,
    tls,
    trace_context,
    unsubscribe,
    webhook_signature,
);

pub use cli::main;
pub use message::NewMessage;
pub use store::{EnqueueError, Preparing, RenderError, Schema, Store};
