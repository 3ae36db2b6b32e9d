//! Asking a live run to stop (`meshrun stop NAME`) or for a profile
//! capture (`meshrun profile NAME`), from another process on the
//! controller's machine. The request is authenticated with the
//! run's token, which only the run's owner can read, exactly as every agent
//! and worker connection is: a process id alone proves nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use meshrun_channel::{auth, Connection};
use meshrun_protocol::token::Token;
use meshrun_protocol::{ClientReply, ClientRequest};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::error::CoreError;
use crate::rundir::lock_is_held;

/// How long the controller may take to connect and answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Between attempts the control port changes: a request that found the old
/// one closed reads the new one and tries again, this many times.
const TRIES: u32 = 20;

/// A runtime of its own, for callers without one.
fn block_on<T>(f: impl std::future::Future<Output = Result<T, CoreError>>) -> Result<T, CoreError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| CoreError::Net {
            what: "cannot start a runtime",
            source,
        })?
        .block_on(f)
}

/// [`request_stop`] on a runtime of its own.
pub fn stop_run(run_dir: &Path, name: &str, now: bool) -> Result<String, CoreError> {
    block_on(request_stop(run_dir, name, now))
}

/// Asks the run in `run_dir` to stop: at once with `now`, else after a
/// checkpoint when its program saves through `meshrun.report` (as SIGTERM
/// does). Returns the controller's answer, saying what it will do.
pub async fn request_stop(run_dir: &Path, name: &str, now: bool) -> Result<String, CoreError> {
    let mut conn = connect_run(run_dir, name).await?;
    conn.send(&ClientRequest::StopRun { now }).await?;
    match conn.recv_timeout::<ClientReply>(ANSWER_WAIT).await? {
        ClientReply::StopAccepted { what } => Ok(what),
        _ => Err(unexpected("stop_accepted")),
    }
}

/// How a profile capture ended (`meshrun profile`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileOutcome {
    pub dir: String,
    pub ranks: Vec<u32>,
    pub missing: Vec<(u32, String)>,
}

/// Asks the run in `run_dir` for a profile capture of `steps` steps of
/// `ranks` (every rank: `None`); `accepted` is called with the folder and
/// ranks once the capture begins, and the call returns when it is saved.
pub fn profile_run(
    run_dir: &Path,
    name: &str,
    ranks: Option<Vec<u32>>,
    steps: u32,
    accepted: impl FnOnce(&str, &[u32]),
) -> Result<ProfileOutcome, CoreError> {
    block_on(async {
        let mut conn = connect_run(run_dir, name).await?;
        conn.send(&ClientRequest::ProfileRun { ranks, steps })
            .await?;
        match conn.recv_timeout::<ClientReply>(ANSWER_WAIT).await? {
            ClientReply::ProfileAccepted { dir, ranks } => accepted(&dir, &ranks),
            ClientReply::Declined { reason } => return Err(CoreError::Declined(reason)),
            _ => return Err(unexpected("profile_accepted")),
        }
        // As long as the steps take: the run says when the traces are in,
        // or that its attempt ended without them.
        match conn.recv::<ClientReply>().await {
            Ok(ClientReply::ProfileSaved {
                dir,
                ranks,
                missing,
            }) => Ok(ProfileOutcome {
                dir,
                ranks,
                missing,
            }),
            Ok(_) => Err(unexpected("profile_saved")),
            Err(_) => Err(CoreError::Declined(
                "the run ended before the capture was saved".into(),
            )),
        }
    })
}

fn unexpected(expected: &'static str) -> CoreError {
    meshrun_protocol::ProtocolError::Unexpected { expected }.into()
}

/// Connects to the run's controller with the run's token. Between
/// attempts the control port changes: a request that found the old one
/// closed reads the new one and tries again.
async fn connect_run(run_dir: &Path, name: &str) -> Result<Connection, CoreError> {
    let not_running = || CoreError::NotRunning {
        name: name.to_string(),
        path: run_dir.to_path_buf(),
    };
    let token_path = run_dir.join("token");
    let token = std::fs::read_to_string(&token_path)
        .map_err(CoreError::io("cannot read the run's token", &token_path))?;
    let token = Token::from_hex(token.trim())?;
    let mut last_error = None;
    for _ in 0..TRIES {
        if !lock_is_held(run_dir) {
            return Err(not_running());
        }
        let Some(addr) = control_addr(run_dir) else {
            return Err(not_running());
        };
        match connect(addr, &token, &token_path).await {
            Ok(conn) => return Ok(conn),
            // Nobody listens there (yet): a restart is under way.
            Err(e @ CoreError::Net { .. }) => last_error = Some(e),
            Err(e) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last_error.unwrap_or_else(not_running))
}

async fn connect(
    addr: SocketAddr,
    token: &Token,
    token_path: &Path,
) -> Result<Connection, CoreError> {
    let net = |what| move |source| CoreError::Net { what, source };
    let stream = tokio::time::timeout(ANSWER_WAIT, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))
        .and_then(|r| r)
        .map_err(net("cannot reach the run's controller"))?;
    // The controller closes a connection that fails the handshake without
    // saying why: whatever ends it here is a refusal of the token.
    auth::connect(stream, token)
        .await
        .map_err(|e| CoreError::TokenRefused {
            path: token_path.to_path_buf(),
            why: e.to_string(),
        })
}

/// The control address of the run's newest attempt, from `run.json`; a
/// controller listening on every interface is reached on loopback.
fn control_addr(run_dir: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(run_dir.join("run.json")).ok()?;
    let run: Value = serde_json::from_str(&text).ok()?;
    let bind: SocketAddr = run["attempts"].as_array()?.last()?["control"]["bind"]
        .as_str()?
        .parse()
        .ok()?;
    let ip = match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Some(SocketAddr::new(ip, bind.port()))
}
