//! Writes held until the reply is awaited: a message's body and its final dot leave in
//! one packet instead of two.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use lettre::transport::smtp::client::AsyncTokioStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Above this, held writes are sent without waiting for a read: a big message streams.
const MAX_CORKED: usize = 64 * 1024;

/// A TCP stream that holds what is written until the next read (or shutdown), then sends
/// it in one write. SMTP is request and reply: every write is followed by a read of the
/// reply, so nothing waits longer than it would have. lettre flushes after each of its
/// writes; a flush here only marks the data as ready to go with the next read.
#[derive(Debug)]
pub(super) struct Corked {
    tcp: TcpStream,
    held: Vec<u8>,
    sent: usize,
}

impl Corked {
    pub(super) fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            held: Vec::new(),
            sent: 0,
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Corked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.held.len() >= MAX_CORKED {
            ready!(this.poll_send(cx))?;
        }
        this.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

impl AsyncRead for Corked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncTokioStream for Corked {
    fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp.peer_addr()
    }
}
