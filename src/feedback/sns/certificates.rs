//! SNS's signing certificates. One is fetched only for a message that passed every check
//! that needs no certificate, once however many requests name it at the same time (they
//! wait for that one fetch and share its result, a failure included), and kept only once a
//! signature verified with it: a flood naming other certificates, real or not, cannot push
//! a good one out of the cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tokio::sync::OnceCell;

use super::not_authentic;
use crate::feedback::fetch::{FetchError, HttpsClient};
use crate::feedback::{FeedbackError, Turnstile};
use crate::lock::lock;

/// Certificates kept; SNS rotates them rarely.
const MAX_CACHED_CERTIFICATES: usize = 16;
/// Certificate fetches at once: anyone who knows a topic ARN can make outboxd fetch from
/// the SNS hosts, and each fetch may take its whole timeout.
const MAX_CONCURRENT_FETCHES: usize = 2;
/// How long a request waits for a fetch of its own to start; it is not refused at once
/// when others are fetching (a cold cache under a flood refused every notification).
const FETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Requests waiting for a certificate at once (for one being fetched, or for a fetch of
/// their own to start); more are refused at once, so that waiting requests cannot hold
/// every connection of the listener.
const MAX_WAITING_FOR_CERTIFICATES: usize = 32;

/// A certificate (DER) being fetched, and how its fetch ended.
type Fetch = OnceCell<Result<Arc<Vec<u8>>, FeedbackError>>;

#[derive(Debug)]
pub(super) struct Certificates {
    client: HttpsClient,
    /// Certificates a signature verified with, by normalized URL.
    verified: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    /// Fetches under way, by normalized URL.
    fetching: Mutex<HashMap<String, Arc<Fetch>>>,
    /// Requests waiting for a certificate, and the fetches among them.
    waiting: Turnstile,
    fetches: Turnstile,
}

impl Certificates {
    pub(super) fn new(client: HttpsClient) -> Self {
        Self {
            client,
            verified: Mutex::default(),
            fetching: Mutex::default(),
            waiting: Turnstile::new(MAX_WAITING_FOR_CERTIFICATES, 0, FETCH_WAIT),
            fetches: Turnstile::new(
                MAX_CONCURRENT_FETCHES,
                MAX_WAITING_FOR_CERTIFICATES,
                FETCH_WAIT,
            ),
        }
    }

    /// The certificate at `url` (normalized): one that verified before, or the result of
    /// the one fetch of it.
    pub(super) async fn get(&self, url: &url::Url) -> Result<Arc<Vec<u8>>, FeedbackError> {
        let key = url.as_str();
        if let Some(der) = lock(&self.verified).get(key) {
            return Ok(Arc::clone(der));
        }
        let _place = self.waiting.enter().await?;
        let cell = Arc::clone(lock(&self.fetching).entry(key.to_owned()).or_default());
        let _leaving = Leaving {
            fetching: &self.fetching,
            key,
            cell: &cell,
        };
        cell.get_or_init(|| self.fetch(url)).await.clone()
    }

    /// Keeps a certificate a signature verified with.
    pub(super) fn verified(&self, url: &url::Url, der: &Arc<Vec<u8>>) {
        let mut cache = lock(&self.verified);
        if !cache.contains_key(url.as_str())
            && cache.len() >= MAX_CACHED_CERTIFICATES
            && let Some(evicted) = cache.keys().next().cloned()
        {
            cache.remove(&evicted);
        }
        cache.insert(url.as_str().to_owned(), Arc::clone(der));
    }

    async fn fetch(&self, url: &url::Url) -> Result<Arc<Vec<u8>>, FeedbackError> {
        let _turn = self.fetches.enter().await?;
        let pem = self.client.get(url).await.map_err(|e| match e {
            // Nothing there: as much a forgery as a bad signature, and answered alike.
            FetchError::Answered(answer) => {
                not_authentic(format!("no signing certificate there: {answer}"))
            }
            FetchError::Failed(why) => {
                FeedbackError::Unavailable(format!("cannot fetch the signing certificate: {why}"))
            }
        })?;
        let der = CertificateDer::from_pem_slice(&pem)
            .map_err(|e| not_authentic(format!("the signing certificate is not PEM: {e}")))?;
        Ok(Arc::new(der.as_ref().to_vec()))
    }
}

/// A request's hold on a fetch: when it goes (done, or given up on), the fetch leaves the
/// map once it failed or nobody waits for it any more, so that the map never outgrows
/// what is being fetched.
struct Leaving<'a> {
    fetching: &'a Mutex<HashMap<String, Arc<Fetch>>>,
    key: &'a str,
    cell: &'a Arc<Fetch>,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        let mut fetching = lock(self.fetching);
        let ours = fetching
            .get(self.key)
            .is_some_and(|c| Arc::ptr_eq(c, self.cell));
        // The map's reference and this request's are all that are left.
        let unwaited = Arc::strong_count(self.cell) <= 2;
        let failed = matches!(self.cell.get(), Some(Err(_)));
        if ours && (unwaited || failed) {
            fetching.remove(self.key);
        }
    }
}
