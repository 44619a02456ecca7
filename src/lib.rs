//! outboxd: a transactional-outbox email dispatcher for PostgreSQL.
//!
//! Applications insert a row into `outbox_messages` in the same transaction as their
//! business change ([`enqueue`] does it from Rust); outboxd claims due rows, renders them
//! into emails, sends them over SMTP and records the outcome. `ARCHITECTURE.md` orders the
//! modules in layers, from the wiring down to the domain: each uses only those below it.

// Functions fit on a screen (60 lines, clippy.toml); a longer one states why with
// `#[expect(clippy::too_many_lines, reason = "...")]`. Test scenarios are exempt.
#![warn(clippy::too_many_lines)]

pub mod app;
pub mod background;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod doctor;
pub mod feedback;
pub mod http;
pub mod lock;
pub mod mailer;
pub mod message;
pub mod render;
pub mod report;
pub mod store;
pub mod suppression;
pub mod telemetry;
pub mod text;
pub mod trace_context;

pub use message::NewMessage;
pub use store::{EnqueueError, Store};
