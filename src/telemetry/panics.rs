//! Panics reported through the log, with addresses masked, once each. Rust's default hook
//! prints a panic's message to stderr as it is, and a render or a send that panics may
//! quote a recipient; every other log line masks them (see [`mask_addresses`]).
//!
//! Two places catch panics: each message's work, so that a panic is that message's failure,
//! and the supervisor of the background tasks. Both go through [`catch_panic`], which tells
//! the hook, while the code runs, what it is doing ([`PanicContext`]): the hook's one line
//! then says which message or task panicked, and where, so that the caller logs nothing.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::task::Poll;

use tracing::Level;

use crate::text::{mask_addresses, panic_message};

/// The log target of panic reports: a `RUST_LOG` that turns it off sends them to stderr
/// instead, so that no filter can hide a panic.
pub const PANIC_TARGET: &str = "outboxd::panic";

/// What code under [`catch_panic`] is doing, for the hook's line about a panic in it.
#[derive(Debug, Clone, Copy)]
pub struct PanicContext {
    /// The message being worked on.
    pub outbox_id: Option<i64>,
    /// The background task running.
    pub task: Option<&'static str>,
    /// The line's message: what panicked, and what happens next.
    pub what: &'static str,
}

thread_local! {
    /// Set while this thread reports a panic: a panic raised by the logging itself is
    /// written to stderr, never logged again.
    static REPORTING: Cell<bool> = const { Cell::new(false) };
    /// What the code this thread is polling under [`catch_panic`] is doing.
    static CONTEXT: Cell<Option<PanicContext>> = const { Cell::new(None) };
}

/// Replaces the panic hook: each panic becomes one error line with its message masked,
/// what the code was doing when [`catch_panic`] says, where it happened, and a backtrace
/// when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`) asks for one; on stderr instead when
/// logging is not set up or filters it out. Call it first: a panic before it is reported
/// by Rust's hook.
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        report_panic(info, &mut std::io::stderr().lock());
    }));
}

/// Runs `future`, each poll under `context`, and catches a panic in it; returns what the
/// panic said, as it is (a row's `last_error` keeps addresses, as it does an SMTP reply's).
/// The hook has logged it by then, masked.
pub async fn catch_panic<F: Future>(context: PanicContext, future: F) -> Result<F::Output, String> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        let _context = InContext::enter(context);
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(&*payload).to_owned())),
        }
    })
    .await
}

/// Sets this thread's [`PanicContext`] until dropped (unwinding included), then puts back
/// the one before.
struct InContext {
    outer: Option<PanicContext>,
}

impl InContext {
    fn enter(context: PanicContext) -> Self {
        Self {
            outer: CONTEXT.with(|current| current.replace(Some(context))),
        }
    }
}

impl Drop for InContext {
    fn drop(&mut self) {
        let _ = CONTEXT.try_with(|current| current.set(self.outer));
    }
}

/// Reports one panic: logged, or written to `fallback` when the log would not show it.
/// Must never panic (that would abort).
fn report_panic(info: &PanicHookInfo<'_>, fallback: &mut dyn std::io::Write) {
    // A thread whose thread-locals are being destroyed may not ask for its name or reach
    // the subscriber's: only the message and the place, to stderr.
    let Ok(context) = CONTEXT.try_with(Cell::get) else {
        let location = info.location().map(ToString::to_string);
        let message = mask_addresses(panic_message(info.payload()));
        let _ = writeln!(
            fallback,
            "a thread panicked while exiting, at {}: {message}",
            location.as_deref().unwrap_or("an unknown place")
        );
        return;
    };
    let report = PanicReport::of(info, context);
    let nested = REPORTING.with(|reporting| reporting.replace(true));
    if !nested && tracing::enabled!(target: PANIC_TARGET, Level::ERROR) {
        report.log();
    } else {
        // Never `eprintln!`: a failing stderr would panic inside the hook, which aborts.
        let _ = writeln!(fallback, "{report}");
    }
    if !nested {
        REPORTING.with(|reporting| reporting.set(false));
    }
}

/// What the hook reports, addresses masked.
#[derive(Debug)]
struct PanicReport {
    message: String,
    context: Option<PanicContext>,
    location: String,
    thread: String,
    /// Only when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`) asks for one.
    backtrace: Option<String>,
}

impl PanicReport {
    fn of(info: &PanicHookInfo<'_>, context: Option<PanicContext>) -> Self {
        let backtrace = Backtrace::capture();
        Self {
            message: mask_addresses(panic_message(info.payload())).into_owned(),
            context,
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

    fn log(&self) {
        tracing::event!(
            target: PANIC_TARGET,
            Level::ERROR,
            outbox.id = self.context.and_then(|c| c.outbox_id),
            task = self.context.and_then(|c| c.task),
            panic = %self.message,
            location = %self.location,
            thread = %self.thread,
            backtrace = self.backtrace.as_ref().map(tracing::field::display),
            "{}",
            self.context.map_or("a thread panicked", |c| c.what)
        );
    }
}

impl std::fmt::Display for PanicReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(context) = &self.context {
            write!(f, "{}: ", context.what)?;
            if let Some(id) = context.outbox_id {
                write!(f, "outbox.id={id} ")?;
            }
            if let Some(task) = context.task {
                write!(f, "task={task} ")?;
            }
        }
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
mod tests;
