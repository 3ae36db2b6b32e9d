//! The control channel seen from the network: a TCP proxy on 127.0.0.1
//! between a fake worker and a real controller running a run. What the
//! proxy captures holds no metric in the clear; one byte it flips in a
//! report after the handshake gets that frame rejected, the connection
//! closed and a `frame_rejected` event into the run's `events.jsonl`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meshrun_core::controller::progress::ProgressMode;
use meshrun_core::{execute, ExecOptions, Outcome};
use meshrun_loadtest::{spec, CONNECT_ENV, METRICS_ENV, RATE_ENV, SECONDS_ENV};
use meshrun_plan::{RunPlan, RunSpec};

/// The handshake's first message on the wire: a 2-byte length, the
/// client's 9-byte claim and 48 bytes.
const HANDSHAKE_BYTES: usize = 59;

/// What the proxy saw.
#[derive(Default)]
struct Seen {
    /// Every byte of every connection, both ways.
    capture: Vec<u8>,
    /// The proxy's own address on each connection to the controller: the
    /// peer the controller sees.
    upstream: Vec<SocketAddr>,
    /// When the controller closed a connection the proxy had tampered with.
    closed_after_flip: Option<Duration>,
}

/// Forwards each connection to `upstream`. With `flip`, it flips one byte
/// in the middle of that piece (counted from 0 after the handshake) of the
/// first connection's traffic to the controller.
fn proxy(upstream: SocketAddr, flip: Option<usize>) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shared = Arc::clone(&seen);
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(upstream) else {
                return;
            };
            shared
                .lock()
                .unwrap()
                .upstream
                .push(server.local_addr().unwrap());
            let flip = flip.filter(|_| n == 0);
            let flipped_at = Arc::new(Mutex::new(None::<Instant>));
            let (up_in, up_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (seen_up, at) = (Arc::clone(&shared), Arc::clone(&flipped_at));
            std::thread::spawn(move || to_controller(up_in, up_out, flip, &seen_up, &at));
            let seen_down = Arc::clone(&shared);
            std::thread::spawn(move || {
                let (mut from, mut to) = (server, client);
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    seen_down
                        .lock()
                        .unwrap()
                        .capture
                        .extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                if let Some(at) = *flipped_at.lock().unwrap() {
                    seen_down.lock().unwrap().closed_after_flip = Some(at.elapsed());
                }
                let _ = to.shutdown(Shutdown::Write);
            });
        }
    });
    (addr, seen)
}

/// The worker's side of one connection, piece by piece after the handshake.
fn to_controller(
    mut from: TcpStream,
    mut to: TcpStream,
    flip: Option<usize>,
    seen: &Mutex<Seen>,
    flipped_at: &Mutex<Option<Instant>>,
) {
    let mut forward = |bytes: &[u8]| {
        seen.lock().unwrap().capture.extend_from_slice(bytes);
        to.write_all(bytes).is_ok()
    };
    let mut hello = [0u8; HANDSHAKE_BYTES];
    if from.read_exact(&mut hello).is_err() || !forward(&hello) {
        return;
    }
    for piece in 0.. {
        let mut head = [0u8; 2];
        if from.read_exact(&mut head).is_err() {
            break;
        }
        let mut body = vec![0u8; usize::from(u16::from_be_bytes(head))];
        if from.read_exact(&mut body).is_err() {
            break;
        }
        if flip == Some(piece) {
            let middle = body.len() / 2;
            body[middle] ^= 0x20;
            *flipped_at.lock().unwrap() = Some(Instant::now());
        }
        if !forward(&head) || !forward(&body) {
            break;
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One fake worker reporting 100 records a second for a second through
/// the proxy at `via`, to a controller on `port`.
fn plan(runs: &Path, port: u16, via: SocketAddr, metrics: &str) -> RunPlan {
    RunSpec {
        control_port: Some(port),
        ..spec(
            "secure",
            1,
            runs,
            env!("CARGO_BIN_EXE_fake-worker"),
            vec![
                (RATE_ENV.into(), "100".into()),
                (SECONDS_ENV.into(), "1".into()),
                (CONNECT_ENV.into(), via.to_string()),
                (METRICS_ENV.into(), metrics.into()),
            ],
        )
    }
    .validate()
    .expect("a valid plan")
}

fn run(plan: RunPlan) -> Outcome {
    execute(
        plan,
        ExecOptions {
            progress: ProgressMode::Off,
            ..ExecOptions::default()
        },
    )
    .expect("the run ends")
}

fn events(run_dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_network_sees_no_metric_in_the_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let (via, seen) = proxy(SocketAddr::from(([127, 0, 0, 1], port)), None);
    let plan = plan(
        &tmp.path().join("runs"),
        port,
        via,
        r#"{"secret_metric_name": 12345.678}"#,
    );
    let run_dir = plan.run_dir.clone();
    let outcome = run(plan);
    assert_eq!(
        outcome.status,
        meshrun_core::OutcomeStatus::Succeeded,
        "{:?}",
        outcome.summary
    );
    // The metric went through the proxy and reached the run.
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 100);
    assert!(metrics.contains("\"secret_metric_name\":12345.678"));

    let seen = seen.lock().unwrap();
    assert_eq!(seen.upstream.len(), 1, "the worker came through the proxy");
    assert!(
        seen.capture.len() > 100 * 40,
        "the proxy captured {} bytes",
        seen.capture.len()
    );
    let token = std::fs::read_to_string(run_dir.join("token")).unwrap();
    for clear in [
        &b"secret_metric_name"[..],
        b"12345.678",
        b"report",
        b"worker_hello",
        b"loss",
        token.trim().as_bytes(),
    ] {
        assert!(
            !contains(&seen.capture, clear),
            "{:?} crossed the network in the clear",
            String::from_utf8_lossy(clear)
        );
    }
}

#[test]
fn a_flipped_byte_closes_the_connection_and_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    // Piece 0 is the worker's hello; piece 2 is a burst of reports.
    let (via, seen) = proxy(SocketAddr::from(([127, 0, 0, 1], port)), Some(2));
    let plan = plan(&tmp.path().join("runs"), port, via, "{}");
    let run_dir = plan.run_dir.clone();
    // The worker goes on and exits 0, so the run itself may pass; what is
    // checked is that the altered frame was caught and the connection cut.
    run(plan);

    let seen = seen.lock().unwrap();
    let closed = seen
        .closed_after_flip
        .expect("the controller closed the tampered connection");
    assert!(closed < Duration::from_secs(2), "closed after {closed:?}");

    let events = events(&run_dir);
    let rejected: Vec<_> = events
        .iter()
        .filter(|e| e["event"] == "frame_rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{events:#?}");
    assert_eq!(rejected[0]["attempt"], 1);
    assert_eq!(rejected[0]["peer"], seen.upstream[0].to_string());
    assert!(
        rejected[0]["reason"]
            .as_str()
            .unwrap()
            .contains("does not authenticate"),
        "{:?}",
        rejected[0]
    );
    // Nothing the worker sent after the altered frame was taken.
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap_or_default();
    assert!(
        metrics.lines().count() < 100,
        "every record arrived although one frame was altered"
    );
}
