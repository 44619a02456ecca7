//! outboxd: a transactional-outbox email dispatcher for PostgreSQL.
//!
//! Applications insert a row into `outbox_messages` in the same transaction as their
//! business change ([`enqueue`] does it from Rust); outboxd claims due rows, renders them
//! into emails, sends them over SMTP and records the outcome. See `ARCHITECTURE.md`.

pub mod app;
pub mod cli;
pub mod config;
pub mod dispatcher;
pub mod health;
pub mod http;
pub mod mailer;
pub mod message;
pub mod render;
pub mod report;
pub mod retention;
pub mod store;
pub mod telemetry;

pub use message::NewMessage;
pub use store::{EnqueueError, enqueue};
