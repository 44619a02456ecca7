//! outboxd's integration tests: real PostgreSQL, a real SMTP server (aiosmtpd), and the
//! real application or binary. One test binary, so it links once.

mod admin;
mod bench;
mod browser;
mod cli;
mod delivery;
mod exposure;
mod failures;
mod helpers;
mod hostile;
mod observability;
mod reliability;
mod replicas;
