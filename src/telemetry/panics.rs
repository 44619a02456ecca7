//! Panics reported through the log, with addresses masked. Rust's default hook prints a
//! panic's message to stderr as it is, and a render or a send that panics may quote a
//! recipient; every other log line masks them (see [`mask_addresses`]).

use std::backtrace::{Backtrace, BacktraceStatus};
use std::panic::PanicHookInfo;

use crate::text::{mask_addresses, panic_message};

/// Replaces the panic hook: each panic becomes one error line (or, before logging is set
/// up, one line on stderr) with its message masked, where it happened, and a backtrace
/// when `RUST_BACKTRACE` asks for one. A panic outboxd catches per message is logged again
/// where it is caught, with the message's id.
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let report = PanicReport::of(info);
        if tracing::dispatcher::has_been_set() {
            tracing::error!(
                panic = %report.message,
                location = %report.location,
                thread = %report.thread,
                backtrace = report.backtrace.as_deref(),
                "a thread panicked"
            );
        } else {
            eprintln!("{report}");
        }
    }));
}

/// What a panic hook reports, addresses masked.
struct PanicReport {
    message: String,
    location: String,
    thread: String,
    backtrace: Option<String>,
}

impl PanicReport {
    fn of(info: &PanicHookInfo<'_>) -> Self {
        let backtrace = Backtrace::capture();
        Self {
            message: mask_addresses(panic_message(info.payload())).into_owned(),
            location: info
                .location()
                .map_or_else(|| "an unknown place".to_owned(), ToString::to_string),
            thread: std::thread::current()
                .name()
                .unwrap_or("an unnamed thread")
                .to_owned(),
            backtrace: (backtrace.status() == BacktraceStatus::Captured)
                .then(|| backtrace.to_string()),
        }
    }
}

impl std::fmt::Display for PanicReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "thread '{}' panicked at {}: {}",
            self.thread, self.location, self.message
        )?;
        if let Some(backtrace) = &self.backtrace {
            write!(f, "\n{backtrace}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::log_panics;

    /// Collects what a subscriber writes, for the panicking thread to log into.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn a_panic_is_logged_with_its_addresses_masked_and_where_it_happened() {
        // The global default must be set for the hook to log: a thread-local default alone
        // would not count, so this sets both.
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_writer(std::io::sink)
                .finish(),
        );
        log_panics();
        let joined = std::thread::Builder::new()
            .name("renderer".into())
            .spawn(move || {
                tracing::subscriber::with_default(subscriber, || {
                    panic!("cannot render for Ada <ada.lovelace@example.com>");
                })
            })
            .map(|thread| thread.join());
        let _ = std::panic::take_hook();
        assert!(
            matches!(joined, Ok(Err(_))),
            "the thread should have panicked"
        );
        let logged = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
        assert!(logged.contains("a thread panicked"), "{logged}");
        assert!(logged.contains("***@example.com"), "{logged}");
        assert!(!logged.contains("ada.lovelace"), "{logged}");
        assert!(logged.contains("panics.rs"), "{logged}");
        assert!(logged.contains("renderer"), "{logged}");
    }
}
