//! A worker that speaks meshrun's control protocol and nothing else. The
//! controller starts it in place of the Python interpreter (its arguments,
//! `-m meshrun._bootstrap ...`, are ignored); it reports
//! `MESHRUN_LOAD_RATE` records a second for `MESHRUN_LOAD_SECONDS`, writes
//! how many it sent to `sent-<rank>` in the run directory, and says goodbye.
//! `MESHRUN_LOAD_CONNECT` and `MESHRUN_LOAD_METRICS` let a test put a proxy
//! on its way and add metrics of its own; with `MESHRUN_LOAD_CHECKPOINT_AT`
//! it writes its part of a checkpoint at that record of a second attempt
//! (the scale rig's scenario).

use std::path::Path;
use std::time::{Duration, Instant};

use meshrun_ckpt::manifest::{Leaf, ShardRecord};
use meshrun_loadtest::{CHECKPOINT_AT_ENV, CONNECT_ENV, METRICS_ENV, RATE_ENV, SECONDS_ENV};
use meshrun_protocol::token::Token;
use meshrun_worker::{OnControllerLoss, Report, WorkerClient};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn main() {
    let rank: u32 = var("MESHRUN_RANK").parse().expect("a rank");
    let attempt: u32 = var("MESHRUN_ATTEMPT").parse().expect("an attempt");
    let token = Token::from_hex(&var("MESHRUN_WORKER_KEY")).expect("a worker credential");
    let rate: f64 = var(RATE_ENV).parse().expect("records per second");
    let seconds: f64 = var(SECONDS_ENV).parse().expect("seconds");
    let extra: serde_json::Map<String, serde_json::Value> = std::env::var(METRICS_ENV)
        .map(|text| serde_json::from_str(&text).expect("a JSON object of metrics"))
        .unwrap_or_default();
    let addr = std::env::var(CONNECT_ENV).unwrap_or_else(|_| var("MESHRUN_CONTROL_ADDR"));
    let client = WorkerClient::connect(&addr, &token, rank, attempt, OnControllerLoss::Ignore)
        .expect("the controller accepts the worker");
    let checkpoint_at: Option<u64> = std::env::var(CHECKPOINT_AT_ENV)
        .ok()
        .map(|v| v.parse().expect("a record number"))
        .filter(|_| attempt > 1);
    // The scale rig's scenario: the first attempt fails elsewhere and
    // stops this worker; it reports until then.
    let total = if std::env::var_os(CHECKPOINT_AT_ENV).is_some() && attempt == 1 {
        u64::MAX / 2
    } else {
        (rate * seconds) as u64
    };
    let start = Instant::now();
    for i in 0..total {
        // Paced in batches of 10, as a training loop reports in bursts.
        if i % 10 == 0 {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        if checkpoint_at == Some(i) {
            let dir = Path::new(&var("MESHRUN_STORAGE_DIR"))
                .join("checkpoints")
                .join(format!("tmp-{i}"));
            std::fs::create_dir_all(&dir).expect("the storage is writable");
            let leaf = Leaf {
                path: "params/w".into(),
                dtype: "float32".into(),
                shape: vec![var("MESHRUN_WORLD_SIZE").parse().expect("a world size")],
                shards: vec![ShardRecord {
                    file: format!("rank-{rank}.safetensors"),
                    tensor: "w:0".into(),
                    region: vec![(rank as usize, rank as usize + 1)],
                    rank: None,
                }],
            };
            let extra = (rank == 0).then(|| serde_json::json!({ "step": i }));
            client.checkpoint_written(i, vec![leaf], None, extra);
        }
        let mut metrics =
            serde_json::json!({ "step": i, "loss": 1.0 / (i + 1) as f64, "rank": rank });
        if let Some(m) = metrics.as_object_mut() {
            m.extend(extra.clone());
        }
        // As `meshrun.report` does: the arrival for the host's agent.
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        client.step_reached(i, now_ns);
        client
            .report(Report {
                step: Some(i),
                metrics,
                ..Report::default()
            })
            .expect("a small report fits in a frame");
    }
    client.flush(Duration::from_mins(2));
    let sent = Path::new(&var("MESHRUN_RUN_DIR")).join(format!("sent-{rank}"));
    std::fs::write(&sent, total.to_string()).expect("the run directory is writable");
    client.close(Duration::from_secs(10));
}
