//! The controller's listener. Each connection is authenticated first; a
//! peer that fails the handshake, sends an oversized, truncated or
//! malformed frame, or says something out of turn is dropped, and only
//! that connection: the run goes on. A frame that fails authentication
//! after the handshake (altered or replayed on the way) is also reported,
//! so the run records it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshrun_channel::auth::{self, HANDSHAKE_TIMEOUT};
use meshrun_channel::{Connection, FrameSink};
use meshrun_protocol::frame::{decode, encode};
use meshrun_protocol::token::{Peer, Token};
use meshrun_protocol::{ClientRequest, FromAgent, FromWorker, ProtocolError, ToAgent};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use meshrun_machine::Conn;

/// What the connections tell the supervisor. Every connection is
/// numbered here, once, as it is accepted: the machine names it by that
/// number (an agent's host rank may be assigned later, by the machine).
#[derive(Debug)]
pub enum Event {
    AgentJoined {
        conn: Conn,
        host: Option<u32>,
        host_ip: String,
        pid: u32,
        gpus: Vec<String>,
        free_port: u16,
        controller: Option<String>,
        replica_port: Option<u16>,
        tx: mpsc::UnboundedSender<Bytes>,
    },
    FromAgent {
        conn: Conn,
        msg: FromAgent,
    },
    AgentLost {
        conn: Conn,
        error: String,
    },
    WorkerJoined {
        conn: Conn,
        rank: u32,
        attempt: u32,
        pid: u32,
        tx: mpsc::UnboundedSender<Bytes>,
    },
    FromWorker {
        rank: u32,
        msg: FromWorker,
    },
    /// The worker's connection ended; `clean` when it said goodbye first.
    WorkerLost {
        rank: u32,
        clean: bool,
    },
    /// `meshrun stop`: the answer goes back on `tx`.
    StopRequested {
        conn: Conn,
        now: bool,
        tx: mpsc::UnboundedSender<Bytes>,
    },
    /// `meshrun profile`: answers go back on `tx` (accepted, then saved).
    ProfileRequested {
        conn: Conn,
        ranks: Option<Vec<u32>>,
        steps: u32,
        tx: mpsc::UnboundedSender<Bytes>,
    },
    /// A frame from `peer` did not authenticate after the handshake; its
    /// connection is closed (and, for a worker or an agent, lost next).
    FrameRejected {
        peer: SocketAddr,
        reason: String,
    },
}

/// Accepts connections until the returned task is aborted at the end of
/// the attempt. Each attempt listens on its own port (or, with
/// --control-port, binds the same one again once this loop and every
/// connection it held are gone; workers never reconnect), so nothing from an
/// earlier attempt's processes can reach a later one; and aborting drops
/// every connection the loop accepted, so a worker the attempt could not
/// stop (its agent died) sees its controller go and kills itself.
pub fn spawn_accept_loop(
    listener: TcpListener,
    token: Token,
    events: mpsc::Sender<Event>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        let mut numbered: Conn = 0;
        let mut failing = 0u64;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(e) if lost_before_accept(&e) => {
                            // One connection's trouble (aborted before it
                            // was taken): the next one is taken at once.
                            tracing::debug!("a connection was lost before it was accepted ({e})");
                            continue;
                        }
                        Err(e) => {
                            // Out of descriptors (EMFILE, ENFILE) the
                            // listener stays readable: retrying at once
                            // would spin on it while the connections that
                            // could close starve. Said once per run of
                            // failures, not once per try.
                            if failing == 0 {
                                tracing::warn!("cannot accept a connection ({e}); retrying every {} ms", ACCEPT_RETRY.as_millis());
                            }
                            failing += 1;
                            tokio::time::sleep(ACCEPT_RETRY).await;
                            continue;
                        }
                    };
                    if failing > 0 {
                        tracing::info!("accepting again after {failing} failed tries");
                        failing = 0;
                    }
                    let token = token.clone();
                    let events = events.clone();
                    numbered += 1;
                    let conn = numbered;
                    connections.spawn(async move {
                        if let Err(reason) = serve(stream, peer, conn, &token, &events).await {
                            tracing::debug!(%peer, "connection dropped: {reason}");
                        }
                    });
                }
                Some(_) = connections.join_next() => {}
            }
        }
    })
}

async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    conn: Conn,
    token: &Token,
    events: &mpsc::Sender<Event>,
) -> Result<(), String> {
    let (mut connection, claim) = auth::accept_peer(stream, token)
        .await
        .map_err(|e| e.to_string())?;
    // A frame that failed authentication: recorded, and its connection
    // closed at once.
    let rejected = |e: &ProtocolError| match e {
        ProtocolError::Rejected(reason) => Some(Event::FrameRejected {
            peer,
            reason: (*reason).to_string(),
        }),
        _ => None,
    };
    let body = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connection.recv_body()).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            if let Some(event) = rejected(&e) {
                let _ = events.send(event).await;
            }
            return Err(e.to_string());
        }
        Err(_) => return Err(ProtocolError::Timeout(HANDSHAKE_TIMEOUT).to_string()),
    };
    let hello = Hello::read(&body, claim);
    // A worker's credential speaks as that worker and nothing else: not as
    // an agent, a command (stop, profile), or another rank or attempt.
    if let Peer::Worker { attempt, rank } = claim {
        if !matches!(hello, Ok(Hello::Worker(FromWorker::WorkerHello { rank: r, attempt: a, .. })) if r == rank && a == attempt)
        {
            let reason = format!(
                "the credential of rank {rank} in attempt {attempt} may only say that worker's hello"
            );
            tracing::warn!(%peer, "connection refused: {reason}");
            let _ = events.send(Event::FrameRejected { peer, reason }).await;
            return Err("a worker's credential used for something else".into());
        }
    }
    let hello = hello.map_err(|e| e.to_string())?;
    match hello {
        Hello::Agent(FromAgent::AgentHello {
            host,
            host_ip,
            pid,
            gpus,
            free_port,
            controller,
            replica_port,
        }) => {
            let (sink, mut stream) = connection.split();
            let (tx, sender) = spawn_sender(sink);
            // Clock probes are answered here, not by the supervisor: the
            // shorter the path, the tighter the agent's estimate.
            let echo = tx.clone();
            let _ = events
                .send(Event::AgentJoined {
                    conn,
                    host,
                    host_ip,
                    pid,
                    gpus,
                    free_port,
                    controller,
                    replica_port,
                    tx,
                })
                .await;
            let error = loop {
                match stream.recv::<FromAgent>().await {
                    Ok(FromAgent::ClockProbe { sent_ns }) => {
                        let _ = echo.send(encode(&ToAgent::ClockEcho {
                            sent_ns,
                            controller_ns: meshrun_agent::unix_ns(),
                        }));
                    }
                    Ok(msg) => {
                        let _ = events.send(Event::FromAgent { conn, msg }).await;
                    }
                    Err(e) => {
                        if let Some(event) = rejected(&e) {
                            let _ = events.send(event).await;
                            sender.abort();
                        }
                        break e.to_string();
                    }
                }
            };
            let _ = events.send(Event::AgentLost { conn, error }).await;
            Ok(())
        }
        Hello::Worker(FromWorker::WorkerHello { rank, attempt, pid }) => {
            // The sender lives as long as the supervisor holds `tx`, so the
            // connection stays open until the worker closes it: the worker
            // never mistakes a goodbye for the controller's death.
            let (sink, mut stream) = connection.split();
            let (tx, sender) = spawn_sender(sink);
            let _ = events
                .send(Event::WorkerJoined {
                    conn,
                    rank,
                    attempt,
                    pid,
                    tx,
                })
                .await;
            let clean = loop {
                match stream.recv::<FromWorker>().await {
                    Ok(FromWorker::Bye) => break true,
                    Ok(msg) => {
                        let _ = events.send(Event::FromWorker { rank, msg }).await;
                    }
                    Err(e) => {
                        // Closed at once: the supervisor would otherwise
                        // hold the sending half open.
                        if let Some(event) = rejected(&e) {
                            let _ = events.send(event).await;
                            sender.abort();
                        }
                        break false;
                    }
                }
            };
            let _ = events.send(Event::WorkerLost { rank, clean }).await;
            while stream.recv_body().await.is_ok() {}
            Ok(())
        }
        Hello::Client(ClientRequest::StopRun { now }) => {
            hold_request(connection, events, rejected, |tx| Event::StopRequested {
                conn,
                now,
                tx,
            })
            .await
        }
        Hello::Client(ClientRequest::ProfileRun { ranks, steps }) => {
            hold_request(connection, events, rejected, |tx| Event::ProfileRequested {
                conn,
                ranks,
                steps,
                tx,
            })
            .await
        }
        Hello::Agent(_) | Hello::Worker(_) => {
            Err("first message after authentication was not a hello".into())
        }
    }
}

/// The first message of a connection, which says its conversation: a
/// worker's credential can only open a worker's; the run token an
/// agent's or a command's.
enum Hello {
    Agent(FromAgent),
    Worker(FromWorker),
    Client(ClientRequest),
}

impl Hello {
    fn read(body: &[u8], claim: Peer) -> Result<Self, ProtocolError> {
        if let Peer::Worker { .. } = claim {
            return decode(body).map(Hello::Worker);
        }
        match decode::<FromAgent>(body) {
            Ok(hello) => Ok(Hello::Agent(hello)),
            Err(ProtocolError::Malformed(_)) => decode(body).map(Hello::Client),
            Err(e) => Err(e),
        }
    }
}

/// A request from a command (`meshrun stop`, `meshrun profile`): the
/// supervisor gets `event` with the sender its answers go back on, and the
/// connection is held open until the requester has read them and gone.
async fn hold_request(
    connection: Connection,
    events: &mpsc::Sender<Event>,
    rejected: impl Fn(&ProtocolError) -> Option<Event>,
    event: impl FnOnce(mpsc::UnboundedSender<Bytes>) -> Event,
) -> Result<(), String> {
    let (sink, mut stream) = connection.split();
    let (tx, sender) = spawn_sender(sink);
    let _ = events.send(event(tx)).await;
    let end = loop {
        if let Err(e) = stream.recv_body().await {
            break e;
        }
    };
    if let Some(event) = rejected(&end) {
        let _ = events.send(event).await;
        sender.abort();
    }
    Ok(())
}

/// A task that writes what the supervisor sends to `sink`, until the
/// supervisor drops the returned sender or the peer goes away; aborting
/// the task closes the connection's sending half.
fn spawn_sender(mut sink: FrameSink) -> (mpsc::UnboundedSender<Bytes>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let task = tokio::spawn(async move {
        while let Some(body) = rx.recv().await {
            if sink.send_body(body).await.is_err() {
                break;
            }
        }
    });
    (tx, task)
}

/// Binds the control listener on `host` (loopback for the local backend;
/// the Ray backend's agents may be on other machines) at `port`, or at a
/// free port when it is 0.
///
/// The queue of connections the kernel completes before they are
/// accepted holds [`LISTEN_BACKLOG`] (capped by `net.core.somaxconn`), not
/// the 1,024 of `TcpListener::bind`: thousands of workers connect within
/// a second of their launch, and a full queue drops their SYNs, which the
/// senders retry only after 1, 3 and 7 seconds.
pub async fn bind(host: std::net::IpAddr, port: u16) -> std::io::Result<(TcpListener, SocketAddr)> {
    let addr = SocketAddr::new(host, port);
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As TcpListener::bind does: a port of an earlier attempt whose
    // connections linger in TIME_WAIT can be bound again (--control-port).
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(LISTEN_BACKLOG)?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// See [`bind`].
pub const LISTEN_BACKLOG: u32 = 8192;

/// How long the accept loop waits after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// An accept that failed for one connection's sake (it was aborted or
/// refused by a filter before it was taken): the next one can be taken at
/// once. Anything else (out of descriptors or memory) fails again until
/// something is freed, so it is retried later.
fn lost_before_accept(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EPROTO
                | libc::EPERM
                | libc::ETIMEDOUT
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
        )
    )
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
