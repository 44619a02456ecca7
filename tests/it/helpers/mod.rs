//! The real things the tests run against: a fresh PostgreSQL database per test, an
//! aiosmtpd server per test, and the real application or binary, one concern a file.

mod binary;
mod callbacks;
mod cluster;
mod database;
mod fixtures;
mod http;
mod postfix;
mod process;
mod queries;
mod releases;
mod scenario;
mod ses;
mod smtp;
mod smtp_talk;
mod wait;

pub use binary::*;
pub use callbacks::*;
pub use cluster::*;
pub use database::*;
pub use fixtures::*;
pub use http::*;
pub use postfix::*;
pub use process::*;
pub use releases::*;
pub use scenario::*;
pub use ses::*;
pub use smtp::*;
pub use smtp_talk::*;
pub use wait::*;
