//! What the controller said before the connection broke under a send.
//!
//! At the end of an attempt the controller sends every agent its
//! `Shutdown` and closes the connection. An agent sending at that moment
//! (a heartbeat) finds the send failing: the controller closed its end
//! with that heartbeat unread, which resets the connection. The
//! `Shutdown` came first and sits in this socket's receive queue (Linux
//! keeps what arrived readable after a reset), so it is read before the
//! session is called lost; taken for a lost connection, a host whose run
//! is over would instead try to join again until its join timeout.

use std::time::Duration;

use meshrun_channel::FrameStream;
use meshrun_protocol::ToAgent;

/// What has arrived is read at once; this bounds the wait for a peer that
/// neither sends nor resets (a send failing without a reset).
const WITHIN: Duration = Duration::from_secs(1);

/// The `Shutdown` (again, state) the controller sent before the break, if
/// it sent one.
pub(super) async fn shutdown_before_break(
    stream: &mut FrameStream,
) -> Option<(bool, Option<String>)> {
    let until = tokio::time::Instant::now() + WITHIN;
    loop {
        match tokio::time::timeout_at(until, stream.recv::<ToAgent>()).await {
            Ok(Ok(ToAgent::Shutdown { again, state })) => return Some((again, state)),
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use meshrun_channel::auth;
    use meshrun_protocol::token::Token;
    use meshrun_protocol::FromAgent;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    #[tokio::test]
    async fn a_shutdown_sent_before_a_reset_is_read_after_the_failed_send() {
        let token = Token::generate().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server_token = token.clone();
        let controller = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            // A close that resets, as one with unread bytes does. (The
            // deprecation is of lingers that block on drop; a zero one
            // resets at once.)
            #[allow(deprecated)]
            s.set_linger(Some(Duration::ZERO)).unwrap();
            let mut conn = auth::accept(s, &server_token).await.unwrap();
            conn.send(&ToAgent::Shutdown {
                again: false,
                state: Some("failed".into()),
            })
            .await
            .unwrap();
        });
        let conn = auth::connect(TcpStream::connect(addr).await.unwrap(), &token)
            .await
            .unwrap();
        let (mut sink, mut stream) = conn.split();
        controller.await.unwrap();
        // The reset arrives under a send, as under the agent's heartbeat.
        let mut failed = false;
        for _ in 0..200 {
            if sink.send(&FromAgent::Heartbeat).await.is_err() {
                failed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(failed, "the reset never reached a send");
        assert_eq!(
            shutdown_before_break(&mut stream).await,
            Some((false, Some("failed".into())))
        );
        // Nothing more: the next look finds the break at once.
        assert_eq!(shutdown_before_break(&mut stream).await, None);
    }
}
