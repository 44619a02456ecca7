//! The admin page's paused kinds: each with its reason and a button to resume it, and a
//! form to pause a kind; audited like every admin action.

use crate::store::Store;
use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use minijinja::Value;
use minijinja::context;
use serde::Deserialize;
use tracing::info;

use super::{PostedForm, ago, back_to, carries_csrf, database_unavailable};
use crate::http::AdminState;
use crate::message::{Kind, NewPause};
use crate::store::pauses;

/// The section's rows, by kind.
pub(super) async fn rows(pool: &Store, now: DateTime<Utc>) -> anyhow::Result<Vec<Value>> {
    let rows = pauses::list(pool)
        .await?
        .into_iter()
        .map(|p| {
            context! {
                kind => p.kind,
                reason => p.reason,
                paused_by => p.paused_by,
                since => p.paused_at.to_rfc3339(),
                since_ago => ago(p.paused_at, now),
            }
        })
        .collect();
    Ok(rows)
}

#[derive(Debug, Deserialize)]
pub(super) struct PauseForm {
    csrf: String,
    kind: String,
    reason: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct ResumeForm {
    csrf: String,
    kind: String,
}

carries_csrf!(PauseForm, ResumeForm);

pub(super) async fn pause(
    State(state): State<AdminState>,
    PostedForm { actor, form }: PostedForm<PauseForm>,
) -> Response {
    let new = match NewPause::new(form.kind.trim(), &form.reason) {
        Ok(new) => new,
        Err(e) => return back_to(&[], &format!("Could not pause: {e}.")),
    };
    match pauses::pause(&state.pool, &new.kind, &new.reason, &actor.operator).await {
        Ok(pause) => {
            info!(actor = %actor.operator, action = "pause", kind = %pause.kind, reason = %pause.reason, "admin action");
            back_to(
                &[],
                &format!(
                    "Paused {}: its messages wait until it is resumed.",
                    pause.kind
                ),
            )
        }
        Err(e) => database_unavailable(&e),
    }
}

pub(super) async fn resume(
    State(state): State<AdminState>,
    PostedForm { actor, form }: PostedForm<ResumeForm>,
) -> Response {
    let kind = match Kind::parse(&form.kind) {
        Ok(kind) => kind,
        Err(e) => return back_to(&[], &format!("Could not resume: {e}.")),
    };
    match pauses::resume(&state.pool, &kind, &actor.operator).await {
        Ok(true) => {
            info!(actor = %actor.operator, action = "resume", %kind, "admin action");
            back_to(&[], &format!("Resumed {kind}."))
        }
        Ok(false) => back_to(&[], &format!("Could not resume: {kind} is not paused.")),
        Err(e) => database_unavailable(&e),
    }
}
