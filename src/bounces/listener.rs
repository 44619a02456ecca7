//! The bounce listener's accept loop: at most [`MAX_CONNECTIONS`] conversations at once (one
//! more is told 421 and closed, so that a flood cannot hold the listener's memory or the
//! database's connections), each bounded in time as a whole, until shutdown. Conversations
//! under way when it stops are given [`SHUTDOWN_GRACE`] to end.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt as _, BufReader};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::intake::Intake;
use super::session;

/// Conversations at once.
pub const MAX_CONNECTIONS: usize = 32;
/// The longest one conversation may last.
const MAX_CONVERSATION: Duration = Duration::from_secs(10 * 60);
/// How long conversations under way are given at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Takes DSNs on `listener` until `stop`.
pub fn spawn(listener: TcpListener, intake: Intake, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(serve(listener, Arc::new(intake), stop))
}

async fn serve(listener: TcpListener, intake: Arc<Intake>, stop: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, domain = intake.domain(), "bounce listener started");
    }
    let turns = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut conversations = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
            Some(_) = conversations.join_next(), if !conversations.is_empty() => continue,
        };
        let (mut stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                debug!(error = %e, "bounce listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(turn) = Arc::clone(&turns).try_acquire_owned() else {
            conversations.spawn(async move {
                let _ = stream.write_all(b"421 4.7.0 too many connections; try again later\r\n").await;
            });
            continue;
        };
        let intake = Arc::clone(&intake);
        conversations.spawn(async move {
            let _turn = turn;
            let (reader, mut writer) = stream.split();
            let mut reader = BufReader::new(reader);
            let talked = tokio::time::timeout(
                MAX_CONVERSATION,
                session::converse(&mut reader, &mut writer, &intake),
            )
            .await;
            match talked {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, error = %e, "bounce listener: a conversation ended early"),
                Err(_) => debug!(%peer, "bounce listener: a conversation went on too long"),
            }
        });
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while conversations.join_next().await.is_some() {}
    })
    .await;
    conversations.abort_all();
    info!("bounce listener stopped");
}
