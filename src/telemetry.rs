//! Logging set-up.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(e) = installed {
        eprintln!("warning: logging was already set up: {e}");
    }
}
