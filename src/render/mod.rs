//! Kind + payload -> an email: templates, addresses, header safety and the Message-ID.
//!
//! Templates are parsed once at start-up. A kind is a directory holding `subject.txt`,
//! `body.txt` and optionally `body.html`; HTML templates are auto-escaped. Everything a
//! payload contains reaches headers only through lettre's typed headers, after CR and LF
//! have been refused, so a payload can never add a header.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use lettre::Message;
use lettre::address::Envelope;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use minijinja::value::Serde;
use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value;

use crate::message::{ClaimedMessage, MessageIds, ReturnPaths};
use crate::text::debug_showing_only;
use crate::unsubscribe::OneClick;

mod addresses;
mod dkim;
mod errors;
mod extras;
mod headers;
mod preview;
mod templates;

pub use addresses::{envelope_keys, suppression_key};

/// A claimed payload as a JSON object, or why it cannot be used.
pub type ReadPayload = Result<Value, String>;
pub use dkim::{Algorithm as DkimAlgorithm, DkimKey};
use errors::describe;
pub use errors::{RenderError, TemplateLoadError};
use extras::DeclaredHeader;
pub use headers::XOutboxId;
pub use preview::Preview;
pub(crate) use templates::{BUILTIN_KIND_FILES, KIND_FILE};
use templates::{BUILTIN_TEMPLATES, add_template, read_template_dir};

/// Renders outbox rows into emails.
pub struct Renderer {
    env: Environment<'static>,
    kinds: BTreeSet<String>,
    from: Mailbox,
    message_ids: MessageIds,
    limits: RenderLimits,
    /// The headers each kind declares in its `headers.txt`.
    declared: BTreeMap<String, Vec<DeclaredHeader>>,
    /// The kinds with a sender of their own (their kind.toml's `from` and `reply_to`).
    senders: BTreeMap<String, KindSender>,
    /// Signs every email when a DKIM key is configured.
    dkim: Option<dkim::DkimSigner>,
    /// One-click unsubscribe links in the bulk kinds' emails, when on.
    one_click: Option<headers::OneClickLinks>,
    /// Each email's own signed envelope sender, when bounces come back to outboxd.
    return_paths: Option<Arc<ReturnPaths>>,
}

/// A kind's own sender: its `From`, instead of `OUTBOXD_FROM`, and the `Reply-To` of a
/// message whose payload names none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindSender {
    pub from: Option<Mailbox>,
    pub reply_to: Option<Mailbox>,
}

/// What one message may be: bounds on the work and memory any single row can cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// The most addresses in `to`, `cc` and `bcc` together (`OUTBOXD_MAX_RECIPIENTS`).
    pub max_recipients: usize,
    /// The largest payload text, and the largest email (`OUTBOXD_MAX_MESSAGE_BYTES`).
    pub max_message_bytes: usize,
    /// The most bytes a payload's attachments may decode to together
    /// (`OUTBOXD_MAX_ATTACHMENT_BYTES`).
    pub max_attachment_bytes: usize,
}

impl Default for RenderLimits {
    fn default() -> Self {
        Self {
            max_recipients: 1000,
            max_message_bytes: 4 * 1024 * 1024,
            max_attachment_bytes: 2 * 1024 * 1024,
        }
    }
}

/// What one template may spend on one render: about a million instructions, or 64 MB of
/// values (minijinja's fuel). A template that loops on a payload value (`range(n)`, nested
/// loops over a list) once rendered for 20 s and more, holding its send; now it stops, and
/// the message is a dead letter of class `render`. The built-in templates spend a few
/// hundred.
const TEMPLATE_FUEL: u64 = 1_000_000;

/// A subject longer than this is a template's bug; a header line may not pass 998 octets.
const MAX_SUBJECT_CHARS: usize = 500;

/// Control characters have no place in a subject (a tab may stand in unstructured text;
/// addresses allow none at all).
fn has_control(text: &str) -> bool {
    text.chars().any(|c| c.is_control() && c != '\t')
}

/// A kind's rendered subject and bodies.
#[derive(Debug, Clone)]
pub struct Parts {
    pub subject: String,
    pub text: String,
    pub html: Option<String>,
}

/// An email ready for SMTP: who it goes to, and its bytes.
#[derive(Debug, Clone)]
pub struct RenderedEmail {
    pub envelope: Envelope,
    pub bytes: Vec<u8>,
}

debug_showing_only!(Renderer as renderer {
    kinds,
    from = renderer.from.to_string(),
});

impl Renderer {
    /// Loads the built-in templates, then the directory's (which add kinds or replace
    /// built-in files of the same name), and parses every one of them now.
    pub fn new(
        templates_dir: Option<&Path>,
        from: Mailbox,
        message_ids: MessageIds,
    ) -> Result<Self, TemplateLoadError> {
        let mut env = environment();
        let mut names = BTreeSet::new();
        let mut headers_files = BTreeMap::new();
        let builtin = BUILTIN_TEMPLATES
            .iter()
            .map(|(name, source)| ((*name).to_owned(), (*source).to_owned()));
        let from_dir = match templates_dir {
            Some(dir) => read_template_dir(dir)?,
            None => Vec::new(),
        };
        for (name, source) in builtin.chain(from_dir) {
            if let Some(kind) = name.strip_suffix("/headers.txt") {
                headers_files.insert(kind.to_owned(), source);
                continue;
            }
            add_template(&mut env, name.clone(), source)?;
            names.insert(name);
        }
        let mut kinds = BTreeSet::new();
        for name in &names {
            if let Some(kind) = name.strip_suffix("/subject.txt") {
                if !names.contains(&format!("{kind}/body.txt")) {
                    return Err(TemplateLoadError::Layout(
                        kind.to_owned(),
                        "has subject.txt but no body.txt".to_owned(),
                    ));
                }
                kinds.insert(kind.to_owned());
            }
        }
        let mut declared = BTreeMap::new();
        for (kind, source) in headers_files {
            if !kinds.contains(&kind) {
                return Err(TemplateLoadError::Layout(
                    kind,
                    "has headers.txt but no subject.txt".to_owned(),
                ));
            }
            let parsed = extras::parse_headers_file(&kind, &source)
                .map_err(|reason| TemplateLoadError::Layout(kind.clone(), reason))?;
            let mut headers = Vec::with_capacity(parsed.len());
            for (header, value) in parsed {
                add_template(&mut env, header.template.clone(), value)?;
                headers.push(header);
            }
            declared.insert(kind, headers);
        }
        Ok(Self {
            env,
            kinds,
            from,
            message_ids,
            limits: RenderLimits::default(),
            declared,
            senders: BTreeMap::new(),
            dkim: None,
            one_click: None,
            return_paths: None,
        })
    }

    /// Signs every email with these keys (one signature each), over the usual headers and
    /// every header a kind declares. No keys: no signature.
    pub fn with_dkim(mut self, keys: &[DkimKey]) -> Result<Self, String> {
        if keys.is_empty() {
            return Ok(self);
        }
        let declared: Vec<String> = self
            .declared
            .values()
            .flatten()
            .map(|header| header.name.clone())
            .collect();
        self.dkim = Some(dkim::DkimSigner::new(keys, &declared)?);
        Ok(self)
    }

    /// Refuses messages past these limits.
    #[must_use]
    pub fn with_limits(mut self, limits: RenderLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Sends these kinds from their own senders.
    #[must_use]
    pub fn with_senders(mut self, senders: BTreeMap<String, KindSender>) -> Self {
        self.senders = senders;
        self
    }

    /// Gives each email its own signed envelope sender (`OUTBOXD_BOUNCE_DOMAIN`).
    #[must_use]
    pub fn with_return_paths(mut self, paths: Arc<ReturnPaths>) -> Self {
        self.return_paths = Some(paths);
        self
    }

    /// Gives the emails of these bulk kinds a one-click unsubscribe link (RFC 8058).
    #[must_use]
    pub fn with_one_click(mut self, links: Arc<OneClick>, bulk: BTreeSet<String>) -> Self {
        self.one_click = Some(headers::OneClickLinks { links, bulk });
        self
    }

    /// Reads a claimed row's payload, renders it, and formats the email, each within the
    /// limits: what the dispatcher does in two steps, for the renderer's own tests.
    #[cfg(test)]
    pub fn render_claimed(&self, message: &ClaimedMessage) -> Result<RenderedEmail, RenderError> {
        self.render_read(message, &self.read_payload(message))
    }

    /// A claimed row's payload as a JSON object within the size limit, or why it cannot be
    /// used. The dispatcher reads each payload once, for the suppression list and the
    /// render both.
    pub fn read_payload(&self, message: &ClaimedMessage) -> ReadPayload {
        message.read_payload(self.limits.max_message_bytes)
    }

    /// Renders a claimed row from its payload as [`Self::read_payload`] read it, and
    /// formats the email, within the limits.
    pub fn render_read(
        &self,
        message: &ClaimedMessage,
        payload: &ReadPayload,
    ) -> Result<RenderedEmail, RenderError> {
        let payload = payload
            .as_ref()
            .map_err(|e| RenderError::Payload(e.clone()))?;
        let email = self.render(message.id, &message.kind, payload)?;
        let bytes = self.formatted(&email, &message.kind)?;
        if bytes.len() > self.limits.max_message_bytes {
            return Err(RenderError::TooLarge {
                bytes: bytes.len(),
                max: self.limits.max_message_bytes,
            });
        }
        Ok(RenderedEmail {
            envelope: email.envelope().clone(),
            bytes,
        })
    }

    /// The email's bytes as sent: signed when a DKIM key is set, for its From's domain.
    pub(super) fn formatted(&self, email: &Message, kind: &str) -> Result<Vec<u8>, RenderError> {
        let bytes = email.formatted();
        match &self.dkim {
            None => Ok(bytes),
            Some(dkim) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                dkim.sign(&bytes, now, self.sender_of(kind).email.domain())
                    .map_err(RenderError::Build)
            }
        }
    }

    /// The From of a kind's emails: its own, or `OUTBOXD_FROM`.
    fn sender_of(&self, kind: &str) -> &Mailbox {
        self.senders
            .get(kind)
            .and_then(|s| s.from.as_ref())
            .unwrap_or(&self.from)
    }

    /// The kinds this renderer knows, sorted.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.kinds.iter().map(String::as_str)
    }

    /// The Message-ID of a row ([`MessageIds::of`]).
    pub fn message_id(&self, id: i64) -> String {
        self.message_ids.of(id)
    }

    /// Renders one row into an email ready to send.
    pub fn render(&self, id: i64, kind: &str, payload: &Value) -> Result<Message, RenderError> {
        if !self.kinds.contains(kind) {
            return Err(RenderError::UnknownKind(kind.to_owned()));
        }
        addresses::check_count(payload, self.limits.max_recipients)?;
        // Converted once for every template of the kind.
        let context = minijinja::Value::from(Serde(payload));
        let Parts {
            subject,
            text,
            html,
        } = self.parts(kind, &context)?;
        let sender = self.senders.get(kind);
        let from = self.sender_of(kind);
        let mut builder = Message::builder()
            .from(from.clone())
            .subject(&subject)
            .message_id(Some(self.message_id(id)))
            .header(XOutboxId(id))
            // Postmark hands this back as the `outbox_id` metadata of its bounce and
            // complaint webhooks, which is how they find the row; it strips it on delivery.
            .raw_header(HeaderValue::new(
                HeaderName::new_from_ascii_str("X-PM-Metadata-outbox_id"),
                id.to_string(),
            ));
        let reply_to = sender.and_then(|s| s.reply_to.as_ref());
        let return_path = match &self.return_paths {
            Some(paths) => Some(
                paths
                    .of(id)
                    .parse()
                    .map_err(|e| RenderError::Build(format!("the return path: {e}")))?,
            ),
            None => None,
        };
        builder = addresses::add(builder, payload, from, reply_to, return_path)?;
        builder = self.added_headers(builder, id, kind, payload, &context)?;
        let attachments = extras::attachments(payload, self.limits.max_attachment_bytes)?;
        let text_part = || {
            SinglePart::builder()
                .header(ContentType::TEXT_PLAIN)
                .body(text.clone())
        };
        let built = match (html, attachments.is_empty()) {
            (Some(html), true) => builder.multipart(MultiPart::alternative_plain_html(text, html)),
            (None, true) => builder.singlepart(text_part()),
            (html, false) => {
                let mut mixed = match html {
                    Some(html) => MultiPart::mixed()
                        .multipart(MultiPart::alternative_plain_html(text.clone(), html)),
                    None => MultiPart::mixed().singlepart(text_part()),
                };
                for attachment in attachments {
                    mixed = mixed.singlepart(attachment);
                }
                builder.multipart(mixed)
            }
        };
        built.map_err(|e| RenderError::Build(e.to_string()))
    }

    /// The subject (checked as a header) and the text and HTML bodies of a kind.
    pub(super) fn parts(&self, kind: &str, context: &minijinja::Value) -> Result<Parts, RenderError> {
        let subject = self.render_template(&format!("{kind}/subject.txt"), context)?;
        let subject = subject.trim();
        if has_control(subject) {
            return Err(RenderError::HeaderInjection("subject"));
        }
        if subject.is_empty() {
            return Err(RenderError::Template("the subject is empty".to_owned()));
        }
        let length = subject.chars().count();
        if length > MAX_SUBJECT_CHARS {
            return Err(RenderError::Template(format!(
                "the subject is {length} characters: at most {MAX_SUBJECT_CHARS}"
            )));
        }
        let text = self.render_template(&format!("{kind}/body.txt"), context)?;
        let html_name = format!("{kind}/body.html");
        let html = match self.env.get_template(&html_name) {
            Ok(_) => Some(self.render_template(&html_name, context)?),
            Err(_) => None,
        };
        Ok(Parts {
            subject: subject.to_owned(),
            text,
            html,
        })
    }

    pub(super) fn render_template(
        &self,
        name: &str,
        context: &minijinja::Value,
    ) -> Result<String, RenderError> {
        let template = self
            .env
            .get_template(name)
            .map_err(|e| RenderError::Template(e.to_string()))?;
        template
            .render(context)
            .map_err(|e| RenderError::Template(format!("{name}: {}", describe(&e))))
    }
}

/// The templates' environment: strict about undefined values, within the fuel.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    // Debug mode is what makes an error name the variable a payload lacks (`reset_url`
    // is undefined); minijinja enables it by default only in builds with debug
    // assertions, so the release binary said `undefined value` and no more. It costs a
    // note where a template meets an undefined value, and a copy of the template's
    // source when a render fails; errors are shown by `errors::describe`, which leaves
    // that copy (and the payload's values in it) out.
    env.set_debug(true);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env
}

/// [`describe`], and the line it is on: one line, for a start-up error.
#[cfg(test)]
mod tests;
