//! Panics reported through the log, with addresses masked. Rust's default hook prints a
//! panic's message to stderr as it is, and a render or a send that panics may quote a
//! recipient; every other log line masks them (see [`mask_addresses`]).

use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::Cell;
use std::panic::PanicHookInfo;

use tracing::Level;

use crate::text::{mask_addresses, panic_message};

/// The log target of panic reports: a `RUST_LOG` that turns it off sends them to stderr
/// instead, so that no filter can hide a panic.
const TARGET: &str = "outboxd::panic";

thread_local! {
    /// Set while this thread reports a panic: a panic raised by the logging itself is
    /// written to stderr, never logged again (which could loop, or wait on a lock the
    /// first report holds).
    static REPORTING: Cell<bool> = const { Cell::new(false) };
}

/// Replaces the panic hook: each panic becomes one error line with its message masked,
/// where it happened, and a backtrace when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`)
/// asks for one; on stderr instead when logging is not set up or filters it out. Call it
/// first: a panic before it is reported by Rust's hook. A panic outboxd catches per
/// message is logged again where it is caught, with the message's id.
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        report_panic(info, &mut std::io::stderr().lock());
    }));
}

/// Reports one panic: logged, or written to `fallback` when the log would not show it.
fn report_panic(info: &PanicHookInfo<'_>, fallback: &mut dyn std::io::Write) {
    let report = PanicReport::of(info);
    let nested = REPORTING.with(|reporting| reporting.replace(true));
    if !nested && tracing::enabled!(target: TARGET, Level::ERROR) {
        tracing::error!(
            target: TARGET,
            panic = %report.message,
            location = %report.location,
            thread = %report.thread,
            backtrace = report.backtrace.as_ref().map(tracing::field::display),
            "a thread panicked"
        );
    } else {
        // Never `eprintln!`: a failing stderr would panic inside the hook, which aborts.
        let _ = writeln!(fallback, "{report}");
    }
    if !nested {
        REPORTING.with(|reporting| reporting.set(false));
    }
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
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::report_panic;

    /// The panic hook is global: these tests take turns installing theirs.
    static HOOK: Mutex<()> = Mutex::new(());

    /// Collects what is written to it.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn text(&self) -> String {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

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

    /// Panics in a thread that logs through `filter`, with the hook reporting there (and
    /// to a captured stand-in for stderr); returns what was logged and what went to stderr.
    fn reported_panic(filter: &str) -> (String, String) {
        let _turn = HOOK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (logged, stderr) = (Captured::default(), Captured::default());
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(filter))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(logged.clone())
                    .with_ansi(false),
            );
        let fallback = stderr.clone();
        std::panic::set_hook(Box::new(move |info| {
            report_panic(info, &mut fallback.clone());
        }));
        let joined = std::thread::Builder::new()
            .name("renderer".into())
            .spawn(move || {
                tracing::subscriber::with_default(subscriber, || {
                    panic!("cannot render for Ada <ada.lovelace@example.com>");
                })
            })
            .map(|thread| thread.join());
        drop(std::panic::take_hook());
        assert!(
            matches!(joined, Ok(Err(_))),
            "the thread should have panicked"
        );
        (logged.text(), stderr.text())
    }

    #[test]
    fn a_panic_is_logged_with_its_addresses_masked_and_where_it_happened() {
        let (logged, stderr) = reported_panic("info");
        assert!(logged.contains("a thread panicked"), "{logged}");
        assert!(logged.contains("***@example.com"), "{logged}");
        assert!(!logged.contains("ada.lovelace"), "{logged}");
        assert!(logged.contains("panics.rs"), "{logged}");
        assert!(logged.contains("renderer"), "{logged}");
        assert_eq!(stderr, "");
    }

    #[test]
    fn a_panic_that_the_log_filter_leaves_out_goes_to_stderr_masked() {
        let (logged, stderr) = reported_panic("outboxd::dispatch=debug");
        assert_eq!(logged, "");
        assert!(stderr.contains("thread 'renderer' panicked at"), "{stderr}");
        assert!(stderr.contains("***@example.com"), "{stderr}");
        assert!(!stderr.contains("ada.lovelace"), "{stderr}");
    }
}
