//! The worker's bound on unsent reports, against a real controller end
//! over TCP that stops reading.

use meshrun_channel::auth;
use tokio::net::TcpListener;

use super::*;

/// A report of about 64 KiB.
fn big_report(step: u64) -> Report {
    Report {
        step: Some(step),
        metrics: serde_json::json!({"step": step, "blob": "x".repeat(64 << 10)}),
        ..Report::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_stops_reading_costs_counted_reports_not_the_workers_memory() {
    const SENT: u64 = 2_000; // 128 MiB of reports, 8x the bound
    let token = Token::generate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // A worker holds its own credential, not the run token.
    let client_key = meshrun_protocol::token::worker_key(&token, 1, 0);
    let client = tokio::task::spawn_blocking(move || {
        WorkerClient::connect(&addr, &client_key, 0, 1, OnControllerLoss::Ignore).unwrap()
    });
    let (stream, _) = listener.accept().await.unwrap();
    let (mut conn, _) = auth::accept_peer(stream, &token).await.unwrap();
    assert!(matches!(
        conn.recv::<FromWorker>().await.unwrap(),
        FromWorker::WorkerHello { rank: 0, .. }
    ));
    let client = client.await.unwrap();

    // Nothing is read meanwhile: the socket's buffers fill, the writer
    // blocks, and the queue stops at its bound.
    let client = tokio::task::spawn_blocking(move || {
        for step in 0..SENT {
            client.report(big_report(step)).unwrap();
            assert!(client.unsent.bytes.load(Ordering::SeqCst) <= UNSENT_REPORT_BYTES);
        }
        client
    })
    .await
    .unwrap();

    let closing = tokio::task::spawn_blocking(move || client.close(Duration::from_mins(1)));
    let (mut received, mut shed, mut steps) = (0u64, 0u64, Vec::new());
    loop {
        match conn.recv::<FromWorker>().await.unwrap() {
            FromWorker::Report { step, .. } => {
                received += 1;
                steps.push(step.unwrap());
            }
            FromWorker::ReportsShed { count } => shed += count,
            FromWorker::Bye => break,
            FromWorker::Heartbeat => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    closing.await.unwrap();
    assert!(shed > 0, "nothing was shed: {received} received");
    assert_eq!(
        received + shed,
        SENT,
        "{received} received, {shed} said shed"
    );
    // What was sent came in order: the oldest reports, then what fitted
    // as the queue drained.
    assert!(steps.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(steps[0], 0);
}
