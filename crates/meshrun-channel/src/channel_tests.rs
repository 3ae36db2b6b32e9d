//! The secure channel over real TCP on 127.0.0.1 (async and blocking ends),
//! and, in memory, what becomes of altered, replayed and reordered pieces.

use std::io::Write as _;
use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::*;
use crate::auth::{self, HANDSHAKE_TIMEOUT};
use meshrun_protocol::token::Token;
use meshrun_protocol::{FromWorker, ToWorker};

/// Text of `bytes` bytes that does not repeat itself.
fn text_of(bytes: usize) -> String {
    (0..bytes)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect()
}

/// A worker's frame of about `bytes` bytes.
fn frame_of(bytes: usize) -> FromWorker {
    FromWorker::Failure {
        kind: "E".into(),
        message: text_of(bytes),
        traceback: String::new(),
    }
}

/// The controller's answer to a worker, of about `bytes` bytes.
fn answer_of(bytes: usize) -> ToWorker {
    ToWorker::StepNotCommitted {
        step: 3,
        error: text_of(bytes),
    }
}

fn report(step: u64) -> FromWorker {
    FromWorker::Report {
        step: Some(step),
        metrics: serde_json::json!({"loss": 0.25, "step": step}),
        checkpoint: false,
        timing: None,
        saving: false,
        total_steps: None,
    }
}

/// What a server connection received until its first error.
type Received = (Vec<FromWorker>, ProtocolError);

/// A server that accepts `n` connections one after another with `token`
/// and reads each until it fails.
async fn reading_server(
    token: Token,
    n: usize,
) -> (SocketAddr, tokio::task::JoinHandle<Vec<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut all = Vec::new();
        for _ in 0..n {
            let (s, _) = listener.accept().await.unwrap();
            let mut conn = auth::accept(s, &token).await.unwrap();
            let mut got = Vec::new();
            let end = loop {
                match conn.recv::<FromWorker>().await {
                    Ok(msg) => got.push(msg),
                    Err(e) => break e,
                }
            };
            all.push((got, end));
        }
        all
    });
    (addr, server)
}

/// A blocking client's socket after its handshake, and its keys.
fn blocking_client(addr: SocketAddr, token: &Token) -> (std::net::TcpStream, Keys) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).unwrap();
    let keys =
        auth::connect_blocking(&mut stream, token, meshrun_protocol::token::Peer::Run).unwrap();
    (stream, keys)
}

/// The wire bytes of `msgs`, sealed in order with `keys`' sending half.
fn sealed(keys: Keys, msgs: &[FromWorker]) -> Vec<Vec<u8>> {
    let (_, mut w) = keys.into_blocking(std::io::empty(), Vec::new());
    let mut out = Vec::new();
    for msg in msgs {
        let start = w.get_ref().len();
        w.send(msg).unwrap();
        out.push(w.get_ref()[start..].to_vec());
    }
    out
}

#[tokio::test]
async fn async_round_trip_with_a_frame_over_one_noise_message() {
    let token = Token::generate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let t = token.clone();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut conn = auth::accept(s, &t).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(conn.recv::<FromWorker>().await.unwrap());
        }
        // Back on the split halves.
        let (mut sink, mut stream) = conn.split();
        for m in &got {
            sink.send(m).await.unwrap();
        }
        (got, stream.recv::<FromWorker>().await)
    });
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut conn = auth::connect(stream, &token).await.unwrap();
    let big = frame_of(900 * 1024);
    let sent = vec![FromWorker::Heartbeat, big, report(7)];
    for m in &sent {
        conn.send(m).await.unwrap();
    }
    for m in &sent {
        assert_eq!(&conn.recv::<FromWorker>().await.unwrap(), m);
    }
    drop(conn);
    let (got, end) = server.await.unwrap();
    assert_eq!(got, sent);
    assert!(matches!(end, Err(ProtocolError::Closed)), "{end:?}");
}

#[tokio::test]
async fn a_frame_over_the_limit_is_refused_before_it_is_sent() {
    let (_, keys) = auth::handshake_in_memory(&Token::generate().unwrap());
    let (_, mut w) = keys.into_blocking(std::io::empty(), Vec::new());
    let r = w.send(&frame_of(MAX_FRAME_BYTES));
    assert!(matches!(r, Err(ProtocolError::TooLarge(_))), "{r:?}");
    assert!(w.get_ref().is_empty());
}

/// Counts the writes that reach the socket.
struct Counted<W> {
    inner: W,
    writes: usize,
}

impl<W: std::io::Write> std::io::Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writes += 1;
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn blocking_round_trip_writes_a_burst_at_once() {
    let token = Token::generate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let t = token.clone();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut conn = auth::accept(s, &t).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(conn.recv::<FromWorker>().await.unwrap());
        }
        conn.send(&ToWorker::CheckpointNow).await.unwrap();
        conn.send(&answer_of(900 * 1024)).await.unwrap();
        (got, conn.recv::<FromWorker>().await)
    });
    let client = tokio::task::spawn_blocking(move || {
        let (stream, keys) = blocking_client(addr, &token);
        let (mut r, mut w) = keys.into_blocking(
            stream.try_clone().unwrap(),
            Counted {
                inner: stream,
                writes: 0,
            },
        );
        for step in 0..3 {
            w.put(&report(step)).unwrap();
        }
        assert_eq!(w.get_ref().writes, 0, "nothing is written before the flush");
        w.flush().unwrap();
        assert_eq!(w.get_ref().writes, 1, "three frames, one write");
        w.send(&frame_of(900 * 1024)).unwrap();
        let back: [ToWorker; 2] = [r.recv().unwrap(), r.recv().unwrap()];
        w.get_ref()
            .inner
            .shutdown(std::net::Shutdown::Write)
            .unwrap();
        back
    });
    let back = client.await.unwrap();
    assert_eq!(back, [ToWorker::CheckpointNow, answer_of(900 * 1024)]);
    let (got, end) = server.await.unwrap();
    assert_eq!(got, [report(0), report(1), report(2), frame_of(900 * 1024)]);
    assert!(matches!(end, Err(ProtocolError::Closed)), "{end:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_client_with_a_wrong_token_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        auth::accept(s, &Token::generate().unwrap()).await.err()
    });
    let client = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).unwrap();
        auth::connect_blocking(
            &mut stream,
            &Token::generate().unwrap(),
            meshrun_protocol::token::Peer::Run,
        )
        .err()
    });
    let refused = server.await.unwrap();
    assert!(
        matches!(refused, Some(ProtocolError::Auth("wrong run token"))),
        "{refused:?}"
    );
    let c = client.await.unwrap();
    assert!(
        matches!(c, Some(ProtocolError::Closed | ProtocolError::Io(_))),
        "{c:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_byte_after_the_handshake_is_rejected_and_the_connection_closed() {
    let token = Token::generate().unwrap();
    let (addr, server) = reading_server(token.clone(), 1).await;
    let client = tokio::task::spawn_blocking(move || {
        let (mut stream, keys) = blocking_client(addr, &token);
        let frames = sealed(keys, &[report(1), report(2)]);
        stream.write_all(&frames[0]).unwrap();
        let mut tampered = frames[1].clone();
        // Inside the ciphertext, past the 2-byte length.
        tampered[10] ^= 0x01;
        stream.write_all(&tampered).unwrap();
        // The server closes: the read ends without a byte.
        let mut buf = [0u8; 1];
        std::io::Read::read(&mut stream, &mut buf)
    });
    let mut all = server.await.unwrap();
    let (got, end) = all.pop().unwrap();
    assert_eq!(
        got,
        [report(1)],
        "the untouched frame arrives, the altered one not"
    );
    assert!(matches!(end, ProtocolError::Rejected(_)), "{end:?}");
    let read = client.await.unwrap();
    assert!(
        matches!(read, Ok(0)) || read.is_err(),
        "the connection is closed: {read:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_frame_replayed_on_a_new_connection_or_the_same_is_rejected() {
    let token = Token::generate().unwrap();
    let (addr, server) = reading_server(token.clone(), 2).await;
    let client = tokio::task::spawn_blocking(move || {
        // The recorded connection: the frame arrives, then its replay.
        let (mut first, keys) = blocking_client(addr, &token);
        let frame = sealed(keys, &[report(42)]).remove(0);
        first.write_all(&frame).unwrap();
        first.write_all(&frame).unwrap();
        // A new connection with the same token: the recorded frame again.
        let (mut second, _) = blocking_client(addr, &token);
        second.write_all(&frame).unwrap();
        second.shutdown(std::net::Shutdown::Write).unwrap();
        // Both stay open until the server is done with them.
        (first, second)
    });
    let all = server.await.unwrap();
    drop(client.await.unwrap());
    let (got, end) = &all[0];
    assert_eq!(got, &[report(42)], "the frame arrives once");
    assert!(matches!(end, ProtocolError::Rejected(_)), "{end:?}");
    let (got, end) = &all[1];
    assert!(got.is_empty(), "{got:?}");
    assert!(matches!(end, ProtocolError::Rejected(_)), "{end:?}");
}

/// Reads every message from `wire` with the server's half of a channel.
fn read_all(server: Keys, wire: &[u8]) -> (Vec<FromWorker>, ProtocolError) {
    let (mut r, _) = server.into_blocking(wire, std::io::sink());
    let mut got = Vec::new();
    loop {
        match r.recv::<FromWorker>() {
            Ok(msg) => got.push(msg),
            Err(e) => return (got, e),
        }
    }
}

#[test]
fn every_flipped_bit_of_a_frame_is_refused() {
    let token = Token::generate().unwrap();
    // A small frame, and one of two pieces: every byte of the first, and
    // the bytes around the pieces' seams and ends of the second.
    for (msg, positions) in [
        (report(5), None),
        (
            frame_of(70_000),
            Some(vec![0, 1, 2, 100, 65_536, 65_537, 65_538, 65_539, 65_540]),
        ),
    ] {
        let (client, _) = auth::handshake_in_memory(&token);
        let len = sealed(client, std::slice::from_ref(&msg))[0].len();
        let mut positions = positions.unwrap_or_else(|| (0..len).collect());
        positions.extend([len - 17, len - 1]);
        for pos in positions {
            for bit in [0x01u8, 0x80] {
                let (client, server) = auth::handshake_in_memory(&token);
                let mut wire = sealed(client, std::slice::from_ref(&msg)).remove(0);
                wire[pos] ^= bit;
                let (got, end) = read_all(server, &wire);
                assert!(
                    got.is_empty(),
                    "byte {pos} of {len} flipped, the frame read"
                );
                assert!(
                    matches!(
                        end,
                        ProtocolError::Rejected(_) | ProtocolError::Closed | ProtocolError::Io(_)
                    ),
                    "byte {pos}: {end:?}"
                );
            }
        }
    }
}

#[test]
fn reordered_dropped_or_cut_pieces_are_rejected() {
    let token = Token::generate().unwrap();
    let msgs = [report(1), report(2), frame_of(70_000), report(3)];
    let wire = |order: &[usize]| {
        let (client, server) = auth::handshake_in_memory(&token);
        let frames = sealed(client, &msgs);
        (
            server,
            order
                .iter()
                .flat_map(|&i| frames[i].clone())
                .collect::<Vec<u8>>(),
        )
    };

    let (server, in_order) = wire(&[0, 1, 2, 3]);
    let (got, end) = read_all(server, &in_order);
    assert_eq!(got, msgs, "the harness reads frames in order");
    assert!(matches!(end, ProtocolError::Closed), "{end:?}");

    let (server, swapped) = wire(&[1, 0]);
    let (got, end) = read_all(server, &swapped);
    assert!(
        got.is_empty() && matches!(end, ProtocolError::Rejected(_)),
        "{got:?} {end:?}"
    );

    let (server, dropped) = wire(&[0, 2]);
    let (got, end) = read_all(server, &dropped);
    assert_eq!(got, [report(1)]);
    assert!(matches!(end, ProtocolError::Rejected(_)), "{end:?}");

    // The two-piece frame without its last piece, then the next frame.
    let (client, server) = auth::handshake_in_memory(&token);
    let frames = sealed(client, &msgs);
    let first_piece = 2 + MAX_PIECE_BYTES;
    let cut: Vec<u8> = [
        &frames[0][..],
        &frames[1][..],
        &frames[2][..first_piece],
        &frames[3][..],
    ]
    .concat();
    let (got, end) = read_all(server, &cut);
    assert_eq!(got, [report(1), report(2)]);
    assert!(matches!(end, ProtocolError::Rejected(_)), "{end:?}");
}

#[test]
fn pieces_from_another_connection_are_rejected() {
    let token = Token::generate().unwrap();
    let (recorded, _) = auth::handshake_in_memory(&token);
    let frame = sealed(recorded, &[report(9)]).remove(0);
    let (_, server) = auth::handshake_in_memory(&token);
    let (got, end) = read_all(server, &frame);
    assert!(
        got.is_empty() && matches!(end, ProtocolError::Rejected(_)),
        "{got:?} {end:?}"
    );
}
