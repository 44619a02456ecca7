//! The admin page's suppression list: a search, the addresses found, a form to add one and
//! a button to remove each; audited like every admin action.

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
use crate::store::suppressions;
use crate::suppression::{AddRequest, Address, Scope, SuppressionReason};
use crate::text::mask_addresses;

/// Addresses the page shows at once.
const SHOWN: i64 = 50;

/// The section's rows, in address order: those matching `search` after `after`, and the
/// `after` of the next page when there is one.
pub(super) async fn rows(
    pool: &Store,
    search: Option<&str>,
    after: Option<&str>,
    now: DateTime<Utc>,
) -> anyhow::Result<(Vec<Value>, Option<String>)> {
    let search = search.map(str::trim).filter(|s| !s.is_empty());
    let after = after.filter(|s| !s.is_empty());
    let page = suppressions::list(pool, search, after, SHOWN).await?;
    let next = suppressions::next_address(&page, SHOWN);
    let rows = page
        .into_iter()
        .map(|s| {
            context! {
                address => s.address,
                scope => s.scope.0.as_str(),
                reason => s.reason.0.as_str(),
                source => s.source,
                detail => s.detail.unwrap_or_default(),
                since => s.created_at.to_rfc3339(),
                since_ago => ago(s.created_at, now),
                until => s.suppressed_until.map(|u| u.format("%Y-%m-%d %H:%M UTC").to_string()),
                active => s.active,
            }
        })
        .collect();
    Ok((rows, next))
}

/// The reasons an operator may choose.
pub(super) fn reasons() -> Vec<&'static str> {
    SuppressionReason::ALL.iter().map(|r| r.as_str()).collect()
}

#[derive(Debug, Deserialize)]
pub(super) struct AddForm {
    csrf: String,
    address: String,
    reason: SuppressionReason,
    /// `all` when the form says none.
    #[serde(default)]
    scope: Option<Scope>,
    #[serde(default)]
    detail: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct RemoveForm {
    csrf: String,
    address: String,
    /// The row's entry; every entry of the address when none.
    #[serde(default)]
    scope: Option<Scope>,
}

carries_csrf!(AddForm, RemoveForm);

/// Back to the page with a notice, which travels in the redirect's URL (into the browser's
/// history and any proxy's access log): never with an address in it.
fn back(notice: &str) -> Response {
    back_to(&[], &mask_addresses(notice))
}

pub(super) async fn add(
    State(state): State<AdminState>,
    PostedForm { actor, form }: PostedForm<AddForm>,
) -> Response {
    let request = AddRequest {
        address: form.address,
        reason: Some(form.reason),
        scope: form.scope,
        detail: Some(form.detail).filter(|d| !d.trim().is_empty()),
        until: None,
    };
    let entry = match request.entry(Utc::now()) {
        Ok(entry) => entry,
        Err(e) => return back(&format!("Could not suppress: {e}.")),
    };
    match suppressions::add(&state.pool, &entry, &actor.operator).await {
        Ok(()) => {
            info!(actor = %actor.operator, action = "suppress", reason = entry.reason.as_str(), "admin action");
            back(&format!(
                "Suppressed the address ({}, {}); search the list below to see it.",
                entry.reason,
                entry.scope
            ))
        }
        Err(e) => database_unavailable(&e),
    }
}

pub(super) async fn remove(
    State(state): State<AdminState>,
    PostedForm { actor, form }: PostedForm<RemoveForm>,
) -> Response {
    let address = match Address::parse(&form.address) {
        Ok(address) => address,
        Err(e) => return back(&format!("Could not remove: {e}.")),
    };
    match suppressions::remove(&state.pool, &address, form.scope, &actor.operator).await {
        Ok(true) => {
            info!(actor = %actor.operator, action = "unsuppress", "admin action");
            back("Removed the address from the suppression list.")
        }
        Ok(false) => back("Could not remove: the address is not suppressed."),
        Err(e) => database_unavailable(&e),
    }
}
