//! A test's own SMTP conversation with a server, one command at a time, reading each reply
//! whole: for what a real client would not send (a forgery, a flood, a message too large).

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

pub struct SmtpTalk {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// The server's greeting (or its refusal to talk).
    pub greeting: String,
}

impl SmtpTalk {
    pub async fn connect(addr: &str) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (reader, writer) = stream.into_split();
        let mut talk = Self {
            reader: BufReader::new(reader),
            writer,
            greeting: String::new(),
        };
        talk.greeting = talk.reply().await;
        talk
    }

    /// Sends one command; its reply, every line of it.
    pub async fn say(&mut self, command: &str) -> String {
        self.writer
            .write_all(format!("{command}\r\n").as_bytes())
            .await
            .expect("write");
        self.reply().await
    }

    /// MAIL, RCPT, DATA and the text (dot-stuffed): the reply to the last step reached.
    pub async fn send(&mut self, from: &str, to: &str, text: &[u8]) -> String {
        for command in [
            format!("MAIL FROM:<{from}>"),
            format!("RCPT TO:<{to}>"),
            "DATA".to_owned(),
        ] {
            let reply = self.say(&command).await;
            if !reply.starts_with('2') && !reply.starts_with('3') {
                return reply;
            }
        }
        for line in text.split_inclusive(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\n").unwrap_or(line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.starts_with(b".") {
                self.writer.write_all(b".").await.expect("write");
            }
            self.writer.write_all(line).await.expect("write");
            self.writer.write_all(b"\r\n").await.expect("write");
        }
        self.say(".").await
    }

    async fn reply(&mut self) -> String {
        let mut reply = String::new();
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return reply;
            }
            reply.push_str(&line);
            if line.as_bytes().get(3) != Some(&b'-') {
                return reply;
            }
        }
    }
}
