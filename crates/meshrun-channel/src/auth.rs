//! The handshake that opens every control connection: Noise
//! `NNpsk0_25519_ChaChaPoly_BLAKE2s`, with the run token as the pre-shared
//! key and the protocol version in the prologue.
//!
//! The client sends an ephemeral key and a tag that only a holder of the
//! token can make; the server answers with its own ephemeral key and a tag
//! of its own. Both then hold transport keys drawn from the two ephemeral
//! keys and the token, which seal every frame after (see
//! [`crate::channel`]). Each message is 48 bytes behind a 2-byte length;
//! nothing else is read before the handshake succeeds, a failure closes the
//! connection, and the token never crosses the wire. A peer with another
//! token (or another protocol version) fails at the first message it sends
//! or reads. Replaying a recorded first message gets an answer, but the
//! keys it leads to need the recorded client's ephemeral secret, so the
//! first frame that follows is rejected.

use std::io::{Read, Write};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::channel::{piece_len, Connection, Keys};
use meshrun_protocol::frame::{ProtocolError, PROTOCOL_VERSION};
use meshrun_protocol::token::{Peer, Token};

/// A peer that does not finish the handshake in this time is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";

/// Either handshake message: an X25519 ephemeral key and the tag of an
/// empty payload.
const MESSAGE_BYTES: usize = 32 + 16;

/// The client's claim (see [`Peer`]): a role byte, an attempt, a rank.
const CLAIM_BYTES: usize = 9;

/// The client's first message: its claim in the clear, then the first
/// handshake message, made with the key of that claim.
const FIRST_BYTES: usize = CLAIM_BYTES + MESSAGE_BYTES;

/// Bound into the handshake hash: a peer speaking another version of the
/// protocol cannot finish it.
const PROLOGUE: &[u8] = b"meshrun control protocol, version";

/// `key` proves `claim` (the run token, or a worker's credential); the
/// claim is in the prologue, so one changed on the way fails the handshake.
fn handshake(key: &Token, claim: Peer, initiator: bool) -> snow::HandshakeState {
    let params = PATTERN.parse().expect("a valid Noise pattern");
    let prologue = [PROLOGUE, &[PROTOCOL_VERSION], &claim.to_bytes()].concat();
    let builder = snow::Builder::new(params)
        .prologue(&prologue)
        .and_then(|b| b.psk(0, key.as_key()))
        .expect("a prologue and a 32-byte key for NNpsk0");
    if initiator {
        builder.build_initiator()
    } else {
        builder.build_responder()
    }
    .expect("the default resolver has X25519, ChaChaPoly and BLAKE2s")
}

/// The next handshake message written by `hs`, with its length in front.
fn write_next(hs: &mut snow::HandshakeState) -> [u8; 2 + MESSAGE_BYTES] {
    let mut out = [0u8; 2 + MESSAGE_BYTES];
    out[..2].copy_from_slice(&(MESSAGE_BYTES as u16).to_be_bytes());
    let n = hs
        .write_message(&[], &mut out[2..])
        .expect("a handshake message of an empty payload");
    debug_assert_eq!(n, MESSAGE_BYTES);
    out
}

/// The client's first message, with its claim in front.
fn write_first(hs: &mut snow::HandshakeState, claim: Peer) -> [u8; 2 + FIRST_BYTES] {
    let mut out = [0u8; 2 + FIRST_BYTES];
    out[..2].copy_from_slice(&(FIRST_BYTES as u16).to_be_bytes());
    out[2..2 + CLAIM_BYTES].copy_from_slice(&claim.to_bytes());
    let n = hs
        .write_message(&[], &mut out[2 + CLAIM_BYTES..])
        .expect("a handshake message of an empty payload");
    debug_assert_eq!(n, MESSAGE_BYTES);
    out
}

/// Reads the client's claim and first handshake message.
async fn read_first(
    stream: &mut (impl AsyncRead + Unpin),
) -> Result<(Peer, [u8; MESSAGE_BYTES]), ProtocolError> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.map_err(closed)?;
    expect_len(head, FIRST_BYTES)?;
    let mut claim = [0u8; CLAIM_BYTES];
    stream.read_exact(&mut claim).await.map_err(closed)?;
    let mut msg = [0u8; MESSAGE_BYTES];
    stream.read_exact(&mut msg).await.map_err(closed)?;
    let peer = Peer::from_bytes(claim).ok_or(ProtocolError::Auth(
        "the peer claims to be something meshrun does not know",
    ))?;
    Ok((peer, msg))
}

/// Checks a length read off the wire before reading what it announces.
fn expect_message(head: [u8; 2]) -> Result<(), ProtocolError> {
    expect_len(head, MESSAGE_BYTES)
}

fn expect_len(head: [u8; 2], len: usize) -> Result<(), ProtocolError> {
    if piece_len(head) == len {
        Ok(())
    } else {
        Err(ProtocolError::Auth(
            "the peer does not speak meshrun's handshake (another program, or another meshrun version)",
        ))
    }
}

async fn read_message(
    stream: &mut (impl AsyncRead + Unpin),
) -> Result<[u8; MESSAGE_BYTES], ProtocolError> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.map_err(closed)?;
    expect_message(head)?;
    let mut msg = [0u8; MESSAGE_BYTES];
    stream.read_exact(&mut msg).await.map_err(closed)?;
    Ok(msg)
}

fn closed(e: std::io::Error) -> ProtocolError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ProtocolError::Closed
    } else {
        e.into()
    }
}

fn finish(hs: snow::HandshakeState) -> Keys {
    Keys::new(
        hs.into_stateless_transport_mode()
            .expect("both handshake messages are done"),
    )
}

/// Server side for holders of the run token only (another host's agent
/// bringing a replica): a worker's credential is refused.
pub async fn accept(stream: TcpStream, token: &Token) -> Result<Connection, ProtocolError> {
    match accept_peer(stream, token).await? {
        (conn, Peer::Run) => Ok(conn),
        (_, Peer::Worker { .. }) => Err(ProtocolError::Auth(
            "a worker's credential is not taken here: only the run token is",
        )),
    }
}

/// Server side (controller): returns the connection once the peer has
/// proved its claim, and the claim, which bounds what it may say.
pub async fn accept_peer(
    stream: TcpStream,
    token: &Token,
) -> Result<(Connection, Peer), ProtocolError> {
    let _ = stream.set_nodelay(true);
    let mut stream = stream;
    let (keys, peer) = tokio::time::timeout(HANDSHAKE_TIMEOUT, respond(&mut stream, token))
        .await
        .map_err(|_| ProtocolError::Timeout(HANDSHAKE_TIMEOUT))??;
    Ok((Connection::new(stream, keys), peer))
}

async fn respond(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    token: &Token,
) -> Result<(Keys, Peer), ProtocolError> {
    let (peer, first) = read_first(stream).await?;
    let mut hs = handshake(&peer.key(token), peer, false);
    hs.read_message(&first, &mut []).map_err(|_| {
        ProtocolError::Auth(match peer {
            Peer::Run => "wrong run token",
            Peer::Worker { .. } => "wrong credential for the worker it claims to be",
        })
    })?;
    stream.write_all(&write_next(&mut hs)).await?;
    Ok((finish(hs), peer))
}

/// Client side, async, as a holder of the run token (agent, `meshrun
/// stop`).
pub async fn connect(stream: TcpStream, token: &Token) -> Result<Connection, ProtocolError> {
    connect_as(stream, token, Peer::Run).await
}

/// Client side, async, as `claim` proved by `key` (the scale rig's
/// workers).
pub async fn connect_as(
    stream: TcpStream,
    key: &Token,
    claim: Peer,
) -> Result<Connection, ProtocolError> {
    let _ = stream.set_nodelay(true);
    let mut stream = stream;
    let keys = tokio::time::timeout(HANDSHAKE_TIMEOUT, initiate(&mut stream, key, claim))
        .await
        .map_err(|_| ProtocolError::Timeout(HANDSHAKE_TIMEOUT))??;
    Ok(Connection::new(stream, keys))
}

async fn initiate(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    key: &Token,
    claim: Peer,
) -> Result<Keys, ProtocolError> {
    let mut hs = handshake(key, claim, true);
    stream.write_all(&write_first(&mut hs, claim)).await?;
    let answer = read_message(stream).await?;
    hs.read_message(&answer, &mut [])
        .map_err(|_| server_refused())?;
    Ok(finish(hs))
}

/// Client side, blocking (worker): `key` proves `claim` (a worker's
/// credential and its rank). The stream should have a read timeout
/// ([`HANDSHAKE_TIMEOUT`]); the keys make the channel with
/// [`Keys::into_blocking`].
pub fn connect_blocking(
    stream: &mut (impl Read + Write),
    key: &Token,
    claim: Peer,
) -> Result<Keys, ProtocolError> {
    let mut hs = handshake(key, claim, true);
    stream.write_all(&write_first(&mut hs, claim))?;
    stream.flush()?;
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).map_err(closed)?;
    expect_message(head)?;
    let mut answer = [0u8; MESSAGE_BYTES];
    stream.read_exact(&mut answer).map_err(closed)?;
    hs.read_message(&answer, &mut [])
        .map_err(|_| server_refused())?;
    Ok(finish(hs))
}

/// Both ends of a handshake done in memory, client's keys first: for the
/// fuzz target and tests, which need a channel without a socket.
#[doc(hidden)]
pub fn handshake_in_memory(token: &Token) -> (Keys, Keys) {
    let mut client = handshake(token, Peer::Run, true);
    let mut server = handshake(token, Peer::Run, false);
    let first = write_first(&mut client, Peer::Run);
    server
        .read_message(&first[2 + CLAIM_BYTES..], &mut [])
        .expect("the same token");
    let answer = write_next(&mut server);
    client
        .read_message(&answer[2..], &mut [])
        .expect("the same token");
    (finish(client), finish(server))
}

/// The server answered, but not with the token: it is not this run's
/// controller (a server with another token closes without answering).
fn server_refused() -> ProtocolError {
    ProtocolError::Auth("the server does not know the run token")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn pair(
        server_token: Token,
        client_token: Token,
    ) -> (
        Result<Connection, ProtocolError>,
        Result<Connection, ProtocolError>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            accept(s, &server_token).await
        });
        let client = connect(TcpStream::connect(addr).await.unwrap(), &client_token).await;
        (server.await.unwrap(), client)
    }

    #[tokio::test]
    async fn same_token_passes_both_ways() {
        let t = Token::generate().unwrap();
        let (s, c) = pair(t.clone(), t).await;
        assert!(s.is_ok() && c.is_ok(), "{:?} {:?}", s.err(), c.err());
    }

    #[tokio::test]
    async fn wrong_token_is_refused() {
        let (s, c) = pair(Token::generate().unwrap(), Token::generate().unwrap()).await;
        assert!(
            matches!(s, Err(ProtocolError::Auth("wrong run token"))),
            "{:?}",
            s.err()
        );
        // The server closes without answering.
        assert!(
            matches!(c, Err(ProtocolError::Closed | ProtocolError::Io(_))),
            "{:?}",
            c.err()
        );
    }

    #[tokio::test]
    async fn a_server_without_the_token_is_found_out_by_the_client() {
        // A server that answers whatever it is sent, with another token.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let impostor = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut hs = handshake(&Token::generate().unwrap(), Peer::Run, false);
            let (_, first) = read_first(&mut s).await.unwrap();
            // It cannot open the client's first message, but answers anyway
            // with a well-formed message of its own.
            let _ = hs.read_message(&first, &mut []);
            let mut other = handshake(&Token::generate().unwrap(), Peer::Run, true);
            s.write_all(&write_next(&mut other)).await.unwrap();
            s
        });
        let c = connect(
            TcpStream::connect(addr).await.unwrap(),
            &Token::generate().unwrap(),
        )
        .await;
        assert!(
            matches!(
                c,
                Err(ProtocolError::Auth(
                    "the server does not know the run token"
                ))
            ),
            "{:?}",
            c.err()
        );
        drop(impostor.await);
    }

    /// A worker's credential opens a connection as that worker only: the
    /// server learns which, another rank's claim fails, and a server for
    /// holders of the run token alone refuses it.
    #[tokio::test]
    async fn a_worker_credential_proves_its_worker_and_nothing_else() {
        let token = Token::generate().unwrap();
        let me = Peer::Worker {
            attempt: 2,
            rank: 5,
        };
        let key = meshrun_protocol::token::worker_key(&token, 2, 5);
        let serve = |peer_token: Token, only_run: bool| async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                if only_run {
                    accept(s, &peer_token).await.map(|c| (c, Peer::Run))
                } else {
                    accept_peer(s, &peer_token).await
                }
            });
            (addr, server)
        };
        let (addr, server) = serve(token.clone(), false).await;
        let client = connect_as(TcpStream::connect(addr).await.unwrap(), &key, me).await;
        let (_, peer) = server.await.unwrap().unwrap();
        assert!(client.is_ok());
        assert_eq!(peer, me);
        // Its key with another rank's claim, or as a holder of the token.
        for claim in [
            Peer::Worker {
                attempt: 2,
                rank: 6,
            },
            Peer::Worker {
                attempt: 3,
                rank: 5,
            },
            Peer::Run,
        ] {
            let (addr, server) = serve(token.clone(), false).await;
            let _ = connect_as(TcpStream::connect(addr).await.unwrap(), &key, claim).await;
            assert!(
                matches!(server.await.unwrap(), Err(ProtocolError::Auth(_))),
                "{claim:?}"
            );
        }
        let (addr, server) = serve(token.clone(), true).await;
        let _ = connect_as(TcpStream::connect(addr).await.unwrap(), &key, me).await;
        assert!(matches!(
            server.await.unwrap(),
            Err(ProtocolError::Auth(
                "a worker's credential is not taken here: only the run token is"
            ))
        ));
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_at_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        let started = std::time::Instant::now();
        let r = accept(s, &Token::generate().unwrap()).await;
        assert!(started.elapsed() >= HANDSHAKE_TIMEOUT);
        assert!(
            matches!(r, Err(ProtocolError::Timeout(HANDSHAKE_TIMEOUT))),
            "{:?}",
            r.err()
        );
    }

    #[tokio::test]
    async fn a_first_message_of_another_length_is_refused_before_it_is_read() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        // The old protocol's first bytes: a 4-byte length.
        client.write_all(&[0, 0, 0, 120]).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        let r = accept(s, &Token::generate().unwrap()).await;
        assert!(matches!(r, Err(ProtocolError::Auth(_))), "{:?}", r.err());
    }
}
