//! outboxd's integration tests: real PostgreSQL, a real SMTP server (aiosmtpd), and the
//! real application or binary. One test binary, so it links once.

mod admin;
mod bench;
mod book;
mod browser;
mod claim_floor;
mod cli;
mod content;
mod database_health;
mod delivery;
mod deploy;
mod doctor;
mod escaping;
mod exposure;
mod failures;
mod found_pace;
mod helpers;
mod honest_answers;
mod hostile;
mod intake;
mod lanes;
mod lookups;
mod migrations;
mod observability;
mod on_time;
mod own_schema;
mod pauses;
mod policy;
mod poolers;
mod postgres18;
mod producer;
mod reliability;
mod replicas;
mod suppression;
mod timeline;
mod webhooks;
