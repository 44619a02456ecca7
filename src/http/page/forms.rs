//! The admin page's forms: each POST is taken only from the page itself, for the signed-in
//! actor (same origin, and the actor's CSRF token).

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::de::DeserializeOwned;

use super::csrf_refused;
use crate::http::auth::Actor;
use crate::http::{AdminState, plain};

/// A form the admin page posted for the signed-in actor. Extracting it refuses any other
/// post (see [`refuse_forged`]) before the handler runs.
pub(super) struct PostedForm<T> {
    pub actor: Actor,
    pub form: T,
}

/// A form that carries the CSRF token the page put in it.
pub(super) trait CarriesCsrf {
    fn csrf(&self) -> &str;
}

/// Implements [`CarriesCsrf`] for forms whose token is their `csrf` field.
macro_rules! carries_csrf {
    ($($form:ident),*) => {
        $(impl $crate::http::page::forms::CarriesCsrf for $form {
            fn csrf(&self) -> &str {
                &self.csrf
            }
        })*
    };
}
// For the page's forms, and the suppression section's.
pub(super) use carries_csrf;

impl<T> FromRequest<AdminState> for PostedForm<T>
where
    T: DeserializeOwned + CarriesCsrf,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &AdminState) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Extension(actor) = Extension::<Actor>::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let headers = parts.headers.clone();
        let Form(form) = Form::<T>::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        match refuse_forged(state, &actor, &headers, form.csrf()) {
            Some(refused) => Err(refused),
            None => Ok(Self { actor, form }),
        }
    }
}

/// A POST from another site is refused: by its `Origin` (or, without one, its `Referer`)
/// naming another host than the one it was sent to, or by a CSRF token that is not this
/// actor's.
fn refuse_forged(
    state: &AdminState,
    actor: &Actor,
    headers: &HeaderMap,
    csrf: &str,
) -> Option<Response> {
    if !same_origin(headers) {
        return Some(plain(
            StatusCode::FORBIDDEN,
            "outboxd admin: cross-origin form posts are refused\n".to_owned(),
        ));
    }
    (!state.auth.csrf_matches(actor, csrf)).then(csrf_refused)
}

fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(host) = text(header::HOST) else {
        return false;
    };
    let Some(source) = text(header::ORIGIN).or_else(|| text(header::REFERER)) else {
        return true;
    };
    let Ok(source) = url::Url::parse(source) else {
        return false;
    };
    // `Host` carries the port only when it is not the scheme's default; so may `Origin`.
    let Ok(host) = url::Url::parse(&format!("{}://{host}", source.scheme())) else {
        return false;
    };
    source.host_str().is_some()
        && source.host_str() == host.host_str()
        && source.port_or_known_default() == host.port_or_known_default()
}
