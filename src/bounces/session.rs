//! One SMTP conversation on the bounce listener (RFC 5321's server side, as little of it as a
//! DSN's sender needs: EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT). Mail is taken for the
//! bounce domain only: any other recipient is refused (no open relay). Every bound is
//! fixed: a line's length, what is kept of a message, the recipients of one message, the
//! time for each command and the whole conversation, the mistakes before it is closed. The reply to
//! DATA is given only once the message is recorded (or known to need nothing), so a message
//! the listener said it took is never lost: when the database does not answer, the reply is
//! a 451 and the sender keeps it and tries again.

use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::intake::Intake;

/// The longest command line (RFC 5321 § 4.5.3.1.4: 512 octets; some clients send more).
const MAX_COMMAND_BYTES: usize = 1000;
/// The longest text line of a message taken (RFC 5321: 1000 octets; 8BITMIME senders may
/// go over a little).
const MAX_TEXT_LINE_BYTES: usize = 4096;
/// How much of a message is kept: a DSN's report comes before the returned message, and
/// Postfix returns at most 50 000 bytes of the original by default. The rest of a larger
/// one (an NDR that returns a whole attachment) is read and dropped, never refused: a
/// refused DSN is lost, its sender does not bounce a bounce.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// The size offered in EHLO, and the most read of one message.
const MAX_READ_BYTES: usize = 64 * 1024 * 1024;
/// Recipients of one message: a DSN has one.
const MAX_RECIPIENTS: usize = 10;
/// Messages on one connection.
const MAX_MESSAGES: usize = 100;
/// Unknown or out-of-order commands before the connection is closed.
const MAX_MISTAKES: usize = 10;
/// How long a command, or a message's whole text, may take to arrive.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
const DATA_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a conversation ended early.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    #[error("the client was silent too long")]
    Timeout,
    #[error("the connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client sent too many bad commands")]
    TooManyMistakes,
}

/// A line as read: whole, or too long (the rest of it was read and dropped).
enum Line {
    Text(Vec<u8>),
    TooLong,
    Closed,
}

/// Reads one line of at most `max` bytes (its end included); a longer one is read to its
/// end and dropped, so that what follows is read in step.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin), max: usize) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(if line.is_empty() && !too_long { Line::Closed } else { Line::Text(line) });
        }
        let (taken, ended) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buffer.len(), false),
        };
        if !too_long && line.len() + taken <= max {
            line.extend_from_slice(&buffer[..taken]);
        } else {
            too_long = true;
            line.clear();
        }
        reader.consume(taken);
        if ended {
            return Ok(if too_long { Line::TooLong } else { Line::Text(line) });
        }
    }
}

/// One conversation, until QUIT, a bound, or the client goes.
pub async fn converse(
    reader: &mut (impl AsyncBufRead + Unpin),
    writer: &mut (impl AsyncWrite + Unpin),
    intake: &Intake,
) -> Result<(), Ended> {
    let mut conversation = Conversation {
        intake,
        host: intake.domain().to_owned(),
        mail_from: None,
        recipients: Vec::new(),
        messages: 0,
        mistakes: 0,
    };
    let greeting = format!("220 {} outboxd bounce listener ESMTP", conversation.host);
    say(writer, &greeting).await?;
    loop {
        let read = tokio::time::timeout(COMMAND_TIMEOUT, read_line(reader, MAX_COMMAND_BYTES)).await;
        let line = match read {
            Err(_) => {
                say(writer, "421 4.4.2 idle too long; closing").await?;
                return Err(Ended::Timeout);
            }
            Ok(line) => line?,
        };
        let line = match line {
            Line::Closed => return Ok(()),
            Line::TooLong => {
                conversation.mistake(writer, "500 5.5.2 line too long").await?;
                continue;
            }
            Line::Text(bytes) => String::from_utf8_lossy(&bytes).trim_end().to_owned(),
        };
        if conversation.command(&line, reader, writer).await? == Next::Close {
            return Ok(());
        }
    }
}

/// Whether the conversation goes on after a command.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Go,
    Close,
}

/// A conversation's state: the message being given, and the bounds' counts.
struct Conversation<'i> {
    intake: &'i Intake,
    host: String,
    mail_from: Option<String>,
    recipients: Vec<String>,
    messages: usize,
    mistakes: usize,
}

impl Conversation<'_> {
    async fn command(
        &mut self,
        line: &str,
        reader: &mut (impl AsyncBufRead + Unpin),
        writer: &mut (impl AsyncWrite + Unpin),
    ) -> Result<Next, Ended> {
        let (verb, argument) = line.split_once(' ').unwrap_or((line, ""));
        match verb.to_ascii_uppercase().as_str() {
            "EHLO" => {
                self.reset();
                let (host, size) = (&self.host, MAX_READ_BYTES);
                say(writer, &format!("250-{host}\r\n250-SIZE {size}\r\n250-8BITMIME\r\n250-ENHANCEDSTATUSCODES\r\n250 PIPELINING")).await?;
            }
            "HELO" => {
                self.reset();
                say(writer, &format!("250 {}", self.host)).await?;
            }
            "MAIL" => return self.mail(argument, writer).await,
            "RCPT" => self.rcpt(argument, writer).await?,
            "DATA" if self.recipients.is_empty() => self.mistake(writer, "503 5.5.1 RCPT first").await?,
            "DATA" => return self.data(reader, writer).await,
            "RSET" => {
                self.reset();
                say(writer, "250 2.0.0 ok").await?;
            }
            "NOOP" => say(writer, "250 2.0.0 ok").await?,
            "VRFY" => say(writer, "252 2.5.0 cannot verify").await?,
            "QUIT" => {
                say(writer, "221 2.0.0 bye").await?;
                return Ok(Next::Close);
            }
            _ => self.mistake(writer, "502 5.5.1 command not implemented").await?,
        }
        Ok(Next::Go)
    }

    fn reset(&mut self) {
        self.mail_from = None;
        self.recipients.clear();
    }

    async fn mail(&mut self, argument: &str, writer: &mut (impl AsyncWrite + Unpin)) -> Result<Next, Ended> {
        match path_of(argument, "FROM:") {
            _ if self.mail_from.is_some() => self.mistake(writer, "503 5.5.1 MAIL already given").await?,
            _ if self.messages >= MAX_MESSAGES => {
                say(writer, "421 4.7.0 too many messages on one connection; closing").await?;
                return Ok(Next::Close);
            }
            Some((_, parameters)) if declared_size(&parameters) > MAX_READ_BYTES => {
                say(writer, "552 5.3.4 message too big for this listener").await?;
            }
            Some((sender, _)) => {
                self.mail_from = Some(sender);
                say(writer, "250 2.1.0 ok").await?;
            }
            None => self.mistake(writer, "501 5.5.4 syntax: MAIL FROM:<address>").await?,
        }
        Ok(Next::Go)
    }

    async fn rcpt(&mut self, argument: &str, writer: &mut (impl AsyncWrite + Unpin)) -> Result<(), Ended> {
        match path_of(argument, "TO:") {
            _ if self.mail_from.is_none() => self.mistake(writer, "503 5.5.1 MAIL first").await,
            _ if self.recipients.len() >= MAX_RECIPIENTS => say(writer, "452 4.5.3 too many recipients").await,
            Some((to, _)) if self.intake.takes_mail_for(&to) => {
                self.recipients.push(to);
                say(writer, "250 2.1.5 ok").await
            }
            Some(_) => {
                let refusal = format!("550 5.7.1 relaying denied: only mail for {} is taken here", self.host);
                say(writer, &refusal).await
            }
            None => self.mistake(writer, "501 5.5.4 syntax: RCPT TO:<address>").await,
        }
    }

    /// The message's text, and the reply once it is recorded (or needs nothing).
    async fn data(
        &mut self,
        reader: &mut (impl AsyncBufRead + Unpin),
        writer: &mut (impl AsyncWrite + Unpin),
    ) -> Result<Next, Ended> {
        say(writer, "354 end with <CRLF>.<CRLF>").await?;
        let Ok(text) = tokio::time::timeout(DATA_TIMEOUT, read_text(reader)).await else {
            say(writer, "421 4.4.2 the message took too long; closing").await?;
            return Err(Ended::Timeout);
        };
        self.messages += 1;
        let reply = match text? {
            None => {
                self.intake.too_large();
                "552 5.3.4 message too big for this listener"
            }
            Some(text) => match self.intake.take(&self.recipients, &text).await {
                // One answer whatever it was (a bounce recorded, a forgery, an auto-reply):
                // nothing is told of which.
                Ok(_) => "250 2.0.0 ok",
                Err(e) => {
                    tracing::warn!(error = %e, "bounce listener: could not record a DSN; the sender is asked to try again");
                    self.intake.failed();
                    "451 4.3.0 could not record it now; try again later"
                }
            },
        };
        self.reset();
        say(writer, reply).await?;
        Ok(Next::Go)
    }

    /// Answers a bad command; too many of them end the conversation.
    async fn mistake(&mut self, writer: &mut (impl AsyncWrite + Unpin), reply: &str) -> Result<(), Ended> {
        self.mistakes += 1;
        if self.mistakes > MAX_MISTAKES {
            say(writer, "421 4.7.0 too many bad commands; closing").await?;
            return Err(Ended::TooManyMistakes);
        }
        say(writer, reply).await
    }
}

/// A message's text up to the lone `.`, dot-unstuffed: its first [`MAX_MESSAGE_BYTES`]
/// (long lines cut), the rest read and dropped; `None` past [`MAX_READ_BYTES`] (the rest
/// was read, so that the conversation stays in step).
async fn read_text(reader: &mut (impl AsyncBufRead + Unpin)) -> Result<Option<Vec<u8>>, Ended> {
    let mut text = Vec::new();
    let mut read = 0_usize;
    loop {
        let line = match read_line(reader, MAX_TEXT_LINE_BYTES).await? {
            Line::Closed => return Err(Ended::Io(std::io::ErrorKind::UnexpectedEof.into())),
            // Cut: a report's lines are short; a long one is the returned message's.
            Line::TooLong => b"\r\n".to_vec(),
            Line::Text(line) => line,
        };
        if line == b".\r\n" || line == b".\n" {
            return Ok((read <= MAX_READ_BYTES).then_some(text));
        }
        let line = line.strip_prefix(b".").unwrap_or(&line);
        read = read.saturating_add(line.len());
        if text.len() + line.len() <= MAX_MESSAGE_BYTES {
            text.extend_from_slice(line);
        }
    }
}

/// `FROM:<a@b> SIZE=123` → (`a@b`, `SIZE=123`); `None` when it is not of that form.
fn path_of(argument: &str, keyword: &str) -> Option<(String, String)> {
    let head = argument.get(..keyword.len())?;
    if !head.eq_ignore_ascii_case(keyword) {
        return None;
    }
    let rest = argument[keyword.len()..].trim_start();
    let rest = rest.strip_prefix('<')?;
    let (path, parameters) = rest.split_once('>')?;
    Some((path.to_owned(), parameters.trim().to_owned()))
}

/// The `SIZE=` a MAIL command declares, or 0.
fn declared_size(parameters: &str) -> usize {
    parameters
        .split_whitespace()
        .find_map(|p| p.get(..5).filter(|k| k.eq_ignore_ascii_case("SIZE=")).and(p.get(5..)))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn say(writer: &mut (impl AsyncWrite + Unpin), reply: &str) -> Result<(), Ended> {
    writer.write_all(reply.as_bytes()).await?;
    writer.write_all(b"\r\n").await?;
    writer.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{declared_size, path_of};

    #[test]
    fn a_path_and_its_parameters_are_read_whatever_the_case() {
        assert_eq!(path_of("FROM:<>", "FROM:"), Some((String::new(), String::new())));
        assert_eq!(
            path_of("to: <bounces+1.ab@b.example> NOTIFY=NEVER", "TO:"),
            Some(("bounces+1.ab@b.example".into(), "NOTIFY=NEVER".into()))
        );
        assert_eq!(path_of("FROM:a@b", "FROM:"), None);
        assert_eq!(path_of("TO", "TO:"), None);
        assert_eq!(declared_size("BODY=8BITMIME size=4096"), 4096);
        assert_eq!(declared_size(""), 0);
    }
}
