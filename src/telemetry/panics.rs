//! Panics reported through the log, with addresses masked. Rust's default hook prints a
//! panic's message to stderr as it is, and a render or a send that panics may quote a
//! recipient; every other log line masks them (see [`mask_addresses`]).

use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, PanicHookInfo};

use futures_util::FutureExt as _;
use tracing::Level;

use crate::text::{mask_addresses, panic_message};

/// The log target of panic reports, and of the line a caller of [`catch_panic`] writes:
/// a `RUST_LOG` that turns it off sends them to stderr instead, so that no filter can
/// hide a panic.
pub const PANIC_TARGET: &str = "outboxd::panic";

thread_local! {
    /// Set while this thread reports a panic: a panic raised by the logging itself is
    /// written to stderr, never logged again (which could loop, or wait on a lock the
    /// first report holds).
    static REPORTING: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread polls a future run by [`catch_panic`], whose caller logs.
    static CALLER_LOGS: Cell<bool> = const { Cell::new(false) };
    /// Where the last panic of such a future happened, kept by the hook for its caller.
    static CAUGHT_AT: RefCell<Option<PanicPlace>> = const { RefCell::new(None) };
}

/// Replaces the panic hook: each panic becomes one error line with its message masked,
/// where it happened, and a backtrace when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`)
/// asks for one; on stderr instead when logging is not set up or filters it out. Call it
/// first: a panic before it is reported by Rust's hook. A panic caught by
/// [`catch_panic`] is left to its caller's line, which adds what the caller knows.
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        report_panic(info, &mut std::io::stderr().lock());
    }));
}

/// A panic caught by [`catch_panic`]: what it said, as it is (the caller masks what it
/// logs), and where it happened when the hook saw it.
#[derive(Debug)]
pub struct CaughtPanic {
    pub message: String,
    pub place: Option<PanicPlace>,
}

/// Where a panic happened, with a backtrace when one was asked for.
#[derive(Debug)]
pub struct PanicPlace {
    pub location: String,
    pub thread: String,
    pub backtrace: Option<String>,
}

/// Runs `future` and catches a panic in it for the caller to log, once: the hook keeps
/// where the panic happened instead of writing a line of its own (unless the log leaves
/// [`PANIC_TARGET`] out, when it writes to stderr as for any panic). The caller logs to
/// [`PANIC_TARGET`], with the addresses masked.
pub async fn catch_panic<F: Future>(future: F) -> Result<F::Output, CaughtPanic> {
    CAUGHT_AT.take();
    let mut future = std::pin::pin!(future);
    let polled = AssertUnwindSafe(std::future::poll_fn(|cx| {
        let _scope = CallerLogs::enter();
        future.as_mut().poll(cx)
    }))
    .catch_unwind()
    .await;
    polled.map_err(|payload| CaughtPanic {
        message: panic_message(&*payload).to_owned(),
        place: CAUGHT_AT.take(),
    })
}

/// Marks this thread's polls as [`catch_panic`]'s, until dropped (unwinding included).
struct CallerLogs {
    outer: bool,
}

impl CallerLogs {
    fn enter() -> Self {
        Self {
            outer: CALLER_LOGS.with(|caller| caller.replace(true)),
        }
    }
}

impl Drop for CallerLogs {
    fn drop(&mut self) {
        CALLER_LOGS.with(|caller| caller.set(self.outer));
    }
}

/// Reports one panic: logged, kept for a [`catch_panic`] caller to log, or written to
/// `fallback` when the log would not show it.
fn report_panic(info: &PanicHookInfo<'_>, fallback: &mut dyn std::io::Write) {
    let report = PanicReport::of(info);
    let nested = REPORTING.with(|reporting| reporting.replace(true));
    let logged = !nested && tracing::enabled!(target: PANIC_TARGET, Level::ERROR);
    if logged && CALLER_LOGS.with(Cell::get) {
        CAUGHT_AT.with(|at| {
            if let Ok(mut at) = at.try_borrow_mut() {
                *at = Some(report.place);
            }
        });
    } else if logged {
        tracing::error!(
            target: PANIC_TARGET,
            panic = %report.message,
            location = %report.place.location,
            thread = %report.place.thread,
            backtrace = report.place.backtrace.as_ref().map(tracing::field::display),
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
    place: PanicPlace,
}

impl PanicReport {
    fn of(info: &PanicHookInfo<'_>) -> Self {
        let backtrace = Backtrace::capture();
        Self {
            message: mask_addresses(panic_message(info.payload())).into_owned(),
            place: PanicPlace {
                location: info
                    .location()
                    .map_or_else(|| "an unknown place".to_owned(), ToString::to_string),
                thread: std::thread::current()
                    .name()
                    .unwrap_or("an unnamed thread")
                    .to_owned(),
                backtrace: (backtrace.status() == BacktraceStatus::Captured)
                    .then(|| backtrace.to_string()),
            },
        }
    }
}

impl std::fmt::Display for PanicReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "thread '{}' panicked at {}: {}",
            self.place.thread, self.place.location, self.message
        )?;
        if let Some(backtrace) = &self.place.backtrace {
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

    use futures_util::FutureExt as _;

    use super::{CaughtPanic, catch_panic, report_panic};

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

    /// Runs `body` in a thread named `renderer` that logs through `filter`, with the hook
    /// reporting there (and to a captured stand-in for stderr); returns how the thread
    /// ended, what was logged and what went to stderr.
    fn under_hook<T: Send + 'static>(
        filter: &str,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> (std::thread::Result<T>, String, String) {
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
            .spawn(move || tracing::subscriber::with_default(subscriber, body))
            .map(|thread| thread.join());
        drop(std::panic::take_hook());
        let Ok(joined) = joined else {
            panic!("cannot start the thread");
        };
        (joined, logged.text(), stderr.text())
    }

    /// Panics in a thread under the hook; returns what was logged and what went to stderr.
    fn reported_panic(filter: &str) -> (String, String) {
        let (joined, logged, stderr) = under_hook(filter, || {
            panic!("cannot render for Ada <ada.lovelace@example.com>");
        });
        assert!(joined.is_err(), "the thread should have panicked");
        (logged, stderr)
    }

    /// Panics inside [`catch_panic`], then outside it, in a thread under the hook.
    fn caught_panic(filter: &str) -> (CaughtPanic, String, String) {
        let (joined, logged, stderr) = under_hook(filter, || {
            let caught = catch_panic(async {
                panic!("cannot render for Ada <ada.lovelace@example.com>");
            })
            .now_or_never();
            let outside =
                std::panic::catch_unwind(|| panic!("a later panic, not caught for a caller"));
            (caught, outside.is_err())
        });
        let Ok((Some(Err(caught)), true)) = joined else {
            panic!("both panics should have been caught: {joined:?}");
        };
        (caught, logged, stderr)
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

    #[test]
    fn a_panic_caught_for_its_caller_is_left_to_the_callers_line_with_where_it_happened() {
        let (caught, logged, stderr) = caught_panic("info");
        // As it is: the row's `last_error` keeps the address, as it does an SMTP reply's.
        assert!(
            caught.message.contains("ada.lovelace@example.com"),
            "{caught:?}"
        );
        let Some(place) = caught.place else {
            panic!("the hook should have kept where it happened: {caught:?}");
        };
        assert!(place.location.contains("panics.rs"), "{}", place.location);
        assert_eq!(place.thread, "renderer");
        assert!(!logged.contains("cannot render"), "{logged}");
        // The thread's next panic, outside `catch_panic`, is the hook's to log again.
        assert!(
            logged.contains("a later panic, not caught for a caller"),
            "{logged}"
        );
        assert_eq!(stderr, "");
    }

    #[test]
    fn a_caught_panic_that_the_log_filter_leaves_out_still_goes_to_stderr_masked() {
        let (caught, logged, stderr) = caught_panic("outboxd::dispatch=debug");
        assert!(caught.place.is_none(), "{caught:?}");
        assert_eq!(logged, "");
        assert!(stderr.contains("thread 'renderer' panicked at"), "{stderr}");
        assert!(stderr.contains("***@example.com"), "{stderr}");
        assert!(!stderr.contains("ada.lovelace"), "{stderr}");
    }
}
