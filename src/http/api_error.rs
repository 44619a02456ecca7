//! The admin API's errors, one JSON shape for all: `{"error": {"code": "...", "message":
//! "..."}}`, the check of the text a query may hold, and queries read into their types.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{FromRequestParts, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::store::admin::ActionError;
use crate::store::messages::LookupError;

/// An API error, rendered as JSON with a stable shape.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: message.into(),
        }
    }

    /// outboxd's own fault (a task that panicked): logged, and said as such.
    pub(super) fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        tracing::error!(error = %message, "admin API internal error");
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        tracing::error!(error = %error, "admin API database error");
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "database_unavailable",
            message: "the database did not answer; try again".to_owned(),
        }
    }
}

impl From<LookupError> for ApiError {
    fn from(error: LookupError) -> Self {
        let code = match error {
            LookupError::Busy(_) => "lookups_busy",
            LookupError::TimedOut => "lookup_timed_out",
            LookupError::Database(e) => return e.into(),
        };
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code,
            message: error.to_string(),
        }
    }
}

impl From<ActionError> for ApiError {
    fn from(error: ActionError) -> Self {
        match error {
            ActionError::NotFound(_) => Self {
                status: StatusCode::NOT_FOUND,
                code: "not_found",
                message: error.to_string(),
            },
            ActionError::NotDeadLettered { .. } => Self {
                status: StatusCode::CONFLICT,
                code: "not_dead_lettered",
                message: error.to_string(),
            },
            ActionError::PayloadGone(_) => Self {
                status: StatusCode::CONFLICT,
                code: "payload_gone",
                message: error.to_string(),
            },
            ActionError::Database(e) => e.into(),
        }
    }
}

/// Refuses text no kind or error class can contain (NUL and other control characters),
/// which PostgreSQL would otherwise refuse as a database error.
pub fn check_text(name: &str, value: &str) -> Result<(), String> {
    if value.len() > 200 || value.chars().any(char::is_control) {
        return Err(format!(
            "{name} must be up to 200 characters without control characters"
        ));
    }
    Ok(())
}

/// A query read from its raw parameters, or a sentence saying what is wrong with them.
pub trait ParseQuery: Sized {
    /// The parameters it reads; any other is refused by name.
    const PARAMETERS: &'static [&'static str];

    /// Reads the parameters it knows; [`Self::read`] has refused any other.
    fn parse(query: &HashMap<String, String>) -> Result<Self, String>;

    /// `query` read, or why not: first any parameter it does not know.
    fn read(query: &HashMap<String, String>) -> Result<Self, String> {
        if let Some(unknown) = query
            .keys()
            .find(|key| !Self::PARAMETERS.contains(&key.as_str()))
        {
            let (last, rest) = Self::PARAMETERS.split_last().unwrap_or((&"", &[]));
            let known = match rest {
                [] => (*last).to_owned(),
                _ => format!("{} or {last}", rest.join(", ")),
            };
            return Err(format!("unknown parameter {unknown:?}: use {known}"));
        }
        Self::parse(query)
    }
}

/// A query string read into `Q` by [`ParseQuery::parse`]: one it refuses gets the API's
/// 400 before the handler runs.
pub struct CheckedQuery<Q>(pub Q);

impl<S, Q> FromRequestParts<S> for CheckedQuery<Q>
where
    S: Send + Sync,
    Q: ParseQuery,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Query(query) = Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Q::read(&query)
            .map(Self)
            .map_err(|e| ApiError::bad_request(e).into_response())
    }
}
