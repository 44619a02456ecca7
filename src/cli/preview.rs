//! `outboxd preview`: one email rendered exactly as `outboxd run` would send it, without a
//! database or an SMTP server, for template authors.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{ArgGroup, Args};
use lettre::message::Mailbox;

use crate::config::{DEV_FROM, KindArgs, KindBook, UnsubscribeArgs};
use crate::message::{InstallationTag, MessageIds};
use crate::render::{Preview, Renderer};
use crate::text::{printable, printable_lines};

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("part").args(["html", "text", "raw"])))]
pub struct PreviewArgs {
    /// The kind of email, e.g. invoice_notice.
    #[arg(long)]
    pub kind: String,
    /// The payload, a JSON object; `-` reads it from standard input.
    #[arg(long)]
    pub payload: String,
    /// Only the HTML body.
    #[arg(long)]
    pub html: bool,
    /// Only the text body.
    #[arg(long)]
    pub text: bool,
    /// The whole message as it goes over SMTP (RFC 5322, CRLF line ends).
    #[arg(long)]
    pub raw: bool,
    /// Directory of templates, as for `outboxd run`.
    #[arg(long, env = "OUTBOXD_TEMPLATES")]
    pub templates: Option<PathBuf>,
    /// The sender, as for `outboxd run`.
    #[arg(long, env = "OUTBOXD_FROM", default_value = DEV_FROM)]
    pub from: String,
    /// The right-hand side of the Message-ID. Default: the sender's domain.
    #[arg(long, env = "OUTBOXD_MESSAGE_ID_DOMAIN")]
    pub message_id_domain: Option<String>,
    /// The per-kind variables, as for `outboxd run`: with the kind's kind.toml, its settings.
    #[command(flatten)]
    pub kinds: KindArgs,
    /// As for `outboxd run`: a bulk kind's preview shows its one-click unsubscribe link.
    #[command(flatten)]
    pub unsubscribe: UnsubscribeArgs,
}

/// The message id a preview is rendered as.
const PREVIEW_ID: i64 = 0;

pub fn run(args: PreviewArgs) -> anyhow::Result<()> {
    let from: Mailbox = args
        .from
        .parse()
        .with_context(|| format!("invalid --from / OUTBOXD_FROM {:?}", args.from))?;
    let domain = args
        .message_id_domain
        .clone()
        .unwrap_or_else(|| from.email.domain().to_owned());
    let message_ids = MessageIds::new(InstallationTag::preview(), domain);
    let book = KindBook::load(args.templates.as_deref(), &args.kinds)?;
    let mut renderer = Renderer::new(args.templates.as_deref(), from, message_ids)?
        .with_senders(book.senders());
    if let Some(links) = args.unsubscribe.one_click()? {
        let bulk = book.lanes().bulk_kinds().into_iter().collect();
        renderer = renderer.with_one_click(std::sync::Arc::new(links), bulk);
    }
    let text = if args.payload == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the payload from standard input")?;
        text
    } else {
        args.payload.clone()
    };
    let payload: serde_json::Value =
        serde_json::from_str(&text).context("--payload is not valid JSON")?;
    let preview = renderer
        .preview(PREVIEW_ID, &args.kind, &payload)
        .map_err(|e| anyhow::anyhow!("{} ({})", e, e.error_class()))?;
    if args.raw {
        use std::io::Write as _;
        std::io::stdout().write_all(&preview.raw)?;
    } else if args.text {
        out!("{}", printable_lines(&preview.parts.text))?;
    } else if args.html {
        let html = preview
            .parts
            .html
            .with_context(|| format!("kind {} has no body.html", args.kind))?;
        out!("{}", printable_lines(&html))?;
    } else {
        show_all(&preview, &book.settings(&args.kind).describe())?;
    }
    Ok(())
}

/// The headers, the envelope's recipients, each body and the kind's settings.
fn show_all(preview: &Preview, settings: &[String]) -> anyhow::Result<()> {
    let raw = String::from_utf8_lossy(&preview.raw);
    let headers = raw.split("\r\n\r\n").next().unwrap_or_default();
    let recipients: Vec<String> = preview
        .envelope
        .to()
        .iter()
        .map(ToString::to_string)
        .collect();
    outln!("{}", printable_lines(headers))?;
    outln!(
        "\n--- envelope recipients (RCPT TO, not a header) ---\n{}",
        printable(&recipients.join(", "))
    )?;
    outln!(
        "\n--- text/plain ---\n{}",
        printable_lines(&preview.parts.text)
    )?;
    if let Some(html) = &preview.parts.html {
        outln!("--- text/html ---\n{}", printable_lines(html))?;
    }
    outln!("--- kind settings ---\n{}", printable_lines(&settings.join("\n")))?;
    Ok(())
}
