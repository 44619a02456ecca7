//! Panics reported through the log, with addresses masked. Rust's default hook prints a
//! panic's message to stderr as it is, and a render or a send that panics may quote a
//! recipient; every other log line masks them (see [`mask_addresses`]).

use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::{Cell, RefCell};
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::task::Poll;

use tracing::Level;

use crate::text::{mask_addresses, panic_message};

/// The log target of panic reports, and of the line a caller of [`catch_panic`] writes:
/// a `RUST_LOG` that turns it off sends them to stderr instead, so that no filter can
/// hide a panic.
pub const PANIC_TARGET: &str = "outboxd::panic";

thread_local! {
    /// Set while this thread reports a panic: a panic raised by the logging itself is
    /// written to stderr, never logged again.
    static REPORTING: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread runs code under [`catch_panic_now`], whose caller logs.
    static CALLER_LOGS: Cell<bool> = const { Cell::new(false) };
    /// The report of the last panic under it, kept by the hook for that caller.
    static KEPT: RefCell<Option<PanicReport>> = const { RefCell::new(None) };
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

/// A panic caught by [`catch_panic`] or [`catch_panic_now`].
#[derive(Debug)]
pub struct CaughtPanic {
    /// What the panic said, as it is: a caller masks what it logs (a row's `last_error`
    /// keeps addresses, as it does an SMTP reply's).
    pub message: String,
    /// The hook's report, when it left the panic to the caller; `None` when the hook wrote
    /// it to stderr itself (the log leaves [`PANIC_TARGET`] out) or did not run.
    report: Option<PanicReport>,
}

/// Where a panic happened, with a backtrace when one was asked for.
#[derive(Debug)]
pub struct PanicPlace {
    /// The file, line and column.
    pub location: String,
    /// The name of the thread that panicked.
    pub thread: String,
    /// Only when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`) asks for one.
    pub backtrace: Option<String>,
}

impl CaughtPanic {
    /// Where the panic happened, when the hook left it to the caller.
    pub fn place(&self) -> Option<&PanicPlace> {
        self.report.as_ref().map(|report| &report.place)
    }

    /// For a caller whose own line the log would not show: writes the hook's report to
    /// `out` (stderr), unless the hook wrote it there already.
    pub fn write_unlogged(&self, out: &mut dyn std::io::Write) {
        if let Some(report) = &self.report {
            let _ = writeln!(out, "{report}");
        }
    }
}

/// Logs a panic caught by [`catch_panic`] or [`catch_panic_now`], once: what the caller
/// was doing (`what`, with the message's id or the task's name when it knows one), where it
/// happened, and the panic's message with addresses masked. On stderr when the log leaves
/// [`PANIC_TARGET`] out here, so that no filter hides it.
pub fn log_caught(panic: &CaughtPanic, outbox_id: Option<i64>, task: Option<&str>, what: &str) {
    if !tracing::enabled!(target: PANIC_TARGET, Level::ERROR) {
        panic.write_unlogged(&mut std::io::stderr().lock());
        return;
    }
    let place = panic.place();
    tracing::event!(
        target: PANIC_TARGET,
        Level::ERROR,
        outbox.id = outbox_id,
        task,
        panic = %mask_addresses(&panic.message),
        location = place.map(|place| tracing::field::display(&place.location)),
        thread = place.map(|place| tracing::field::display(&place.thread)),
        backtrace = place
            .and_then(|place| place.backtrace.as_ref())
            .map(tracing::field::display),
        "{what}"
    );
}

/// Runs `f` and catches a panic in it for the caller to log, once: the hook keeps its
/// report instead of writing a line of its own (unless the log leaves [`PANIC_TARGET`]
/// out, when it writes to stderr as for any panic). The caller logs to [`PANIC_TARGET`]
/// with the addresses masked, or calls [`CaughtPanic::write_unlogged`] when that target
/// is off where it logs. A panic that code inside `f` catches itself is logged as the
/// hook would have.
pub fn catch_panic_now<T>(f: impl FnOnce() -> T) -> Result<T, CaughtPanic> {
    let scope = CallerLogs::enter();
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    let kept = take_kept();
    drop(scope);
    match result {
        Ok(value) => {
            if let Some(report) = kept {
                report_unclaimed(&report);
            }
            Ok(value)
        }
        Err(payload) => Err(CaughtPanic {
            message: panic_message(&*payload).to_owned(),
            report: kept,
        }),
    }
}

/// [`catch_panic_now`] for a future: each poll runs under it, so that what the hook keeps
/// is taken on the thread that panicked, in the same poll.
pub async fn catch_panic<F: Future>(future: F) -> Result<F::Output, CaughtPanic> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| match catch_panic_now(|| future.as_mut().poll(cx)) {
        Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(panic) => Poll::Ready(Err(panic)),
    })
    .await
}

/// Marks this thread as running under [`catch_panic_now`] until dropped (unwinding
/// included), with nothing kept from before.
struct CallerLogs {
    outer: bool,
}

impl CallerLogs {
    fn enter() -> Self {
        if let Some(leftover) = take_kept() {
            report_unclaimed(&leftover);
        }
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

/// What the hook kept on this thread, if anything.
fn take_kept() -> Option<PanicReport> {
    KEPT.try_with(|kept| kept.try_borrow_mut().ok()?.take())
        .ok()
        .flatten()
}

/// Keeps `report` for the caller. Returns what must be logged now: `report` itself when
/// this thread cannot keep it (its thread-locals are being destroyed), or an earlier
/// report that code inside caught and the caller never claimed.
fn keep(report: PanicReport) -> Option<PanicReport> {
    let mut report = Some(report);
    let mut earlier = None;
    let _ = KEPT.try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            earlier = std::mem::replace(&mut *kept, report.take());
        }
    });
    report.or(earlier)
}

/// A kept report that no caller claimed (code inside caught its panic): logged as the
/// hook would have, or written to stderr where the log leaves [`PANIC_TARGET`] out.
fn report_unclaimed(report: &PanicReport) {
    if tracing::enabled!(target: PANIC_TARGET, Level::ERROR) {
        log_report(report);
    } else {
        let _ = writeln!(std::io::stderr().lock(), "{report}");
    }
}

/// Reports one panic: logged, kept for a [`catch_panic_now`] caller to log, or written
/// to `fallback` when the log would not show it. Must never panic (that would abort).
fn report_panic(info: &PanicHookInfo<'_>, fallback: &mut dyn std::io::Write) {
    // A thread whose thread-locals are being destroyed may not ask for its name or reach
    // the subscriber's: only the message and the place, to stderr.
    if KEPT.try_with(|_| ()).is_err() {
        let location = info.location().map(ToString::to_string);
        let message = mask_addresses(panic_message(info.payload()));
        let _ = writeln!(
            fallback,
            "a thread panicked while exiting, at {}: {message}",
            location.as_deref().unwrap_or("an unknown place")
        );
        return;
    }
    let report = PanicReport::of(info);
    let nested = REPORTING.with(|reporting| reporting.replace(true));
    if !nested && tracing::enabled!(target: PANIC_TARGET, Level::ERROR) {
        if !CALLER_LOGS.with(Cell::get) {
            log_report(&report);
        } else if let Some(unkept) = keep(report) {
            log_report(&unkept);
        }
    } else {
        // Never `eprintln!`: a failing stderr would panic inside the hook, which aborts.
        let _ = writeln!(fallback, "{report}");
    }
    if !nested {
        REPORTING.with(|reporting| reporting.set(false));
    }
}

/// The hook's line.
fn log_report(report: &PanicReport) {
    tracing::error!(
        target: PANIC_TARGET,
        panic = %report.message,
        location = %report.place.location,
        thread = %report.place.thread,
        backtrace = report.place.backtrace.as_ref().map(tracing::field::display),
        "a thread panicked"
    );
}

/// What a panic hook reports, addresses masked.
#[derive(Debug)]
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

    use super::{CaughtPanic, catch_panic, catch_panic_now, report_panic};

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
        let Some(place) = caught.place() else {
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
        // A caller whose own line the log would not show writes the report, masked.
        let mut unlogged = Vec::new();
        caught.write_unlogged(&mut unlogged);
        let unlogged = String::from_utf8_lossy(&unlogged);
        assert!(
            unlogged.contains("thread 'renderer' panicked at"),
            "{unlogged}"
        );
        assert!(unlogged.contains("***@example.com"), "{unlogged}");
        assert!(!unlogged.contains("ada.lovelace"), "{unlogged}");
    }

    #[test]
    fn a_caught_panic_that_the_log_filter_leaves_out_goes_to_stderr_once_masked() {
        let (caught, logged, stderr) = caught_panic("outboxd::dispatch=debug");
        assert!(caught.place().is_none(), "{caught:?}");
        assert_eq!(logged, "");
        assert!(stderr.contains("thread 'renderer' panicked at"), "{stderr}");
        assert!(stderr.contains("***@example.com"), "{stderr}");
        assert!(!stderr.contains("ada.lovelace"), "{stderr}");
        // The hook wrote it already: the caller has nothing more to write.
        let mut unlogged = Vec::new();
        caught.write_unlogged(&mut unlogged);
        assert!(unlogged.is_empty());
    }

    #[test]
    fn a_panic_that_code_inside_catches_itself_is_still_logged_by_the_hook() {
        let (joined, logged, stderr) = under_hook("info", || {
            catch_panic_now(|| {
                let inner =
                    std::panic::catch_unwind(|| panic!("caught inside, by the code itself"));
                inner.is_err()
            })
        });
        assert!(matches!(joined, Ok(Ok(true))), "{joined:?}");
        assert!(
            logged.contains("caught inside, by the code itself"),
            "{logged}"
        );
        assert_eq!(stderr, "");
    }

    #[test]
    fn a_panic_caught_inside_before_the_callers_own_is_still_logged() {
        let (joined, logged, stderr) = under_hook("info", || {
            catch_panic_now(|| {
                let _ = std::panic::catch_unwind(|| panic!("first, caught inside"));
                panic!("second, left to the caller");
            })
            .map_err(|caught| (caught.place().is_some(), caught.message))
        });
        assert!(
            matches!(&joined, Ok(Err((true, message))) if message.contains("second")),
            "{joined:?}"
        );
        assert!(logged.contains("first, caught inside"), "{logged}");
        assert!(!logged.contains("second, left to the caller"), "{logged}");
        assert_eq!(stderr, "");
    }
}
