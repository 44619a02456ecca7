//! The panic hook and `catch_panic`: what a panic in a send logs, and where.

use std::sync::{Arc, Mutex};

use futures_util::FutureExt as _;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;

use super::{PanicContext, catch_panic, report_panic};

/// The panic hook is global: these tests take turns installing theirs.
static HOOK: Mutex<()> = Mutex::new(());

const RENDERING: PanicContext = PanicContext {
    outbox_id: Some(42),
    task: None,
    what: "rendering a message panicked",
};

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
/// reporting there (and to a captured stand-in for stderr); returns how the thread ended,
/// what was logged and what went to stderr.
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
    // Other tests panic meanwhile, on their own threads: only this one's are reported here.
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("renderer") {
            report_panic(info, &mut fallback.clone());
        }
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

/// The logged lines that are events, not a backtrace's (`RUST_BACKTRACE` may be set).
fn events(logged: &str) -> Vec<&str> {
    logged
        .lines()
        .filter(|line| line.contains(" ERROR outboxd::panic: "))
        .collect()
}

/// Panics in a thread under the hook; returns what was logged and what went to stderr.
fn reported_panic(filter: &str) -> (String, String) {
    let (joined, logged, stderr) = under_hook(filter, || {
        panic!("cannot render for Ada <ada.lovelace@example.com>");
    });
    assert!(joined.is_err(), "the thread should have panicked");
    (logged, stderr)
}

/// Panics inside [`catch_panic`], then outside it, in a thread under the hook; returns
/// what the caller got, what was logged and what went to stderr.
fn caught_panic(filter: &str) -> (String, String, String) {
    let (joined, logged, stderr) = under_hook(filter, || {
        let caught = catch_panic(RENDERING, async {
            panic!("cannot render for Ada <ada.lovelace@example.com>");
        })
        .now_or_never();
        let outside = std::panic::catch_unwind(|| panic!("a later panic, outside"));
        (caught, outside.is_err())
    });
    let Ok((Some(Err(said)), true)) = joined else {
        panic!("both panics should have been caught: {joined:?}");
    };
    (said, logged, stderr)
}

#[test]
fn a_panic_is_logged_with_its_addresses_masked_and_where_it_happened() {
    let (logged, stderr) = reported_panic("info");
    assert!(logged.contains("a thread panicked"), "{logged}");
    assert!(logged.contains("***@example.com"), "{logged}");
    assert!(!logged.contains("ada.lovelace"), "{logged}");
    assert!(logged.contains("tests.rs"), "{logged}");
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
fn a_caught_panic_is_logged_once_saying_which_message_and_the_caller_gets_its_text() {
    let (said, logged, stderr) = caught_panic("info");
    // As it is: the row's `last_error` keeps the address, as it does an SMTP reply's.
    assert_eq!(said, "cannot render for Ada <ada.lovelace@example.com>");
    let lines = events(&logged);
    assert_eq!(lines.len(), 2, "{logged}");
    assert!(lines[0].contains(RENDERING.what), "{logged}");
    assert!(lines[0].contains("outbox.id=42"), "{logged}");
    assert!(lines[0].contains("***@example.com"), "{logged}");
    assert!(!logged.contains("ada.lovelace"), "{logged}");
    // Outside `catch_panic` again, the context is gone.
    assert!(lines[1].contains("a thread panicked"), "{logged}");
    assert!(lines[1].contains("a later panic, outside"), "{logged}");
    assert!(!lines[1].contains("outbox.id"), "{logged}");
    assert_eq!(stderr, "");
}

#[test]
fn a_caught_panic_that_the_log_filter_leaves_out_goes_to_stderr_with_its_context() {
    let (_, logged, stderr) = caught_panic("outboxd::dispatch=debug");
    assert_eq!(logged, "");
    assert!(stderr.contains(RENDERING.what), "{stderr}");
    assert!(stderr.contains("outbox.id=42"), "{stderr}");
    assert!(stderr.contains("***@example.com"), "{stderr}");
    assert!(!stderr.contains("ada.lovelace"), "{stderr}");
}

#[test]
fn contexts_nest_and_each_is_put_back() {
    let (joined, logged, _) = under_hook("info", || {
        catch_panic(RENDERING, async {
            let inner = PanicContext {
                outbox_id: None,
                task: Some("sampler"),
                what: "inner",
            };
            let _ = catch_panic(inner, async { panic!("first") }).now_or_never();
            panic!("second");
        })
        .now_or_never()
    });
    assert!(matches!(joined, Ok(Some(Err(_)))), "{joined:?}");
    let lines = events(&logged);
    assert!(
        lines[0].contains("inner") && lines[0].contains("task=\"sampler\""),
        "{logged}"
    );
    assert!(
        lines[1].contains(RENDERING.what) && lines[1].contains("second"),
        "{logged}"
    );
}
