//! Mutual HMAC-SHA256 challenge/response over a fresh connection.
//!
//! The server sends a random nonce; the client answers with
//! `HMAC(token, "client" | server_nonce)` and a nonce of its own; the server
//! answers with `HMAC(token, "server" | client_nonce)`. Neither side sends
//! anything else, nor reads anything else, until this succeeds, and a
//! failure closes the connection. The token never crosses the wire.

use std::io::{Read, Write};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame::{read_frame, write_frame, Connection, ProtocolError};
use super::message::Message;
use crate::token::Token;

/// A peer that does not finish the handshake in this time is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

fn nonce() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS provides random bytes");
    hex::encode(bytes)
}

fn mac(token: &Token, label: &[u8], nonce: &str) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    m.update(label);
    m.update(nonce.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// Constant-time check of a MAC given in hex.
fn verify(token: &Token, label: &[u8], nonce: &str, given_hex: &str) -> bool {
    let Ok(given) = hex::decode(given_hex) else {
        return false;
    };
    let mut m = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    m.update(label);
    m.update(nonce.as_bytes());
    m.verify_slice(&given).is_ok()
}

/// Server side (controller). Returns once the peer has proved the token.
pub async fn accept(conn: &mut Connection, token: &Token) -> Result<(), ProtocolError> {
    let server_nonce = nonce();
    conn.send(&Message::Challenge {
        nonce: server_nonce.clone(),
    })
    .await?;
    let Message::Auth { mac: given, nonce } = conn.recv_timeout(HANDSHAKE_TIMEOUT).await? else {
        return Err(ProtocolError::Auth("first frame was not an authentication"));
    };
    if !verify(token, b"client", &server_nonce, &given) {
        return Err(ProtocolError::Auth("wrong run token"));
    }
    conn.send(&Message::Welcome {
        mac: mac(token, b"server", &nonce),
    })
    .await
}

/// Client side, async (agent).
pub async fn connect(conn: &mut Connection, token: &Token) -> Result<(), ProtocolError> {
    let Message::Challenge {
        nonce: server_nonce,
    } = conn.recv_timeout(HANDSHAKE_TIMEOUT).await?
    else {
        return Err(ProtocolError::Unexpected {
            expected: "challenge",
        });
    };
    let client_nonce = nonce();
    conn.send(&Message::Auth {
        mac: mac(token, b"client", &server_nonce),
        nonce: client_nonce.clone(),
    })
    .await?;
    check_welcome(
        &conn.recv_timeout(HANDSHAKE_TIMEOUT).await?,
        token,
        &client_nonce,
    )
}

/// Client side, blocking (worker). The stream should have a read timeout.
pub fn connect_blocking(
    stream: &mut (impl Read + Write),
    token: &Token,
) -> Result<(), ProtocolError> {
    let Message::Challenge {
        nonce: server_nonce,
    } = read_frame(stream)?
    else {
        return Err(ProtocolError::Unexpected {
            expected: "challenge",
        });
    };
    let client_nonce = nonce();
    write_frame(
        stream,
        &Message::Auth {
            mac: mac(token, b"client", &server_nonce),
            nonce: client_nonce.clone(),
        },
    )?;
    check_welcome(&read_frame(stream)?, token, &client_nonce)
}

fn check_welcome(msg: &Message, token: &Token, client_nonce: &str) -> Result<(), ProtocolError> {
    match msg {
        Message::Welcome { mac } if verify(token, b"server", client_nonce, mac) => Ok(()),
        Message::Welcome { .. } => Err(ProtocolError::Auth("server does not know the run token")),
        _ => Err(ProtocolError::Unexpected {
            expected: "welcome",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair(
        server_token: Token,
        client_token: Token,
    ) -> (Result<(), ProtocolError>, Result<(), ProtocolError>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut conn = Connection::new(s);
            accept(&mut conn, &server_token).await
        });
        let mut conn = Connection::new(TcpStream::connect(addr).await.unwrap());
        let client = connect(&mut conn, &client_token).await;
        (server.await.unwrap(), client)
    }

    #[tokio::test]
    async fn same_token_passes_both_ways() {
        let t = Token::generate().unwrap();
        let (s, c) = pair(t.clone(), t).await;
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
    }

    #[tokio::test]
    async fn wrong_token_is_refused() {
        let (s, c) = pair(Token::generate().unwrap(), Token::generate().unwrap()).await;
        assert!(
            matches!(s, Err(ProtocolError::Auth("wrong run token"))),
            "{s:?}"
        );
        assert!(c.is_err());
    }
}
