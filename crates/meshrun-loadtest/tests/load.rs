//! The controller keeps up with 64 workers each reporting 1,000 records a
//! second: every record arrives (counted per rank by the controller, rank
//! 0's all in `metrics.jsonl`), and its memory stays flat while records
//! stream to disk. `MESHRUN_LOAD_SECONDS` (default 5) and
//! `MESHRUN_LOAD_WORKERS` (default 64) make it longer or wider; `make load`
//! runs a minute and prints the figures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshrun_core::OutcomeStatus;
use meshrun_loadtest::proc_stats::{cpu_seconds, rss_kib};
use meshrun_loadtest::{execute_quietly, spec, RATE_ENV, SECONDS_ENV};

const RATE: u64 = 1000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn controller_keeps_up_with_64_workers_at_1000_records_a_second() {
    let seconds = env_or("MESHRUN_LOAD_SECONDS", 5);
    let workers = env_or("MESHRUN_LOAD_WORKERS", 64) as u32;
    let tmp = tempfile::tempdir().unwrap();
    let plan = spec(
        "load",
        workers,
        &tmp.path().join("runs"),
        env!("CARGO_BIN_EXE_fake-worker"),
        vec![
            (RATE_ENV.into(), RATE.to_string()),
            (SECONDS_ENV.into(), seconds.to_string()),
        ],
    )
    .validate()
    .expect("a valid plan");
    let run_dir = plan.run_dir.clone();

    // Resident memory, sampled every 100 ms while the run goes on.
    let done = Arc::new(AtomicBool::new(false));
    let memory = {
        let done = done.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                samples.push((t0.elapsed().as_secs_f64(), rss_kib()));
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
    };
    let t0 = Instant::now();
    let (own_before, children_before) = cpu_seconds();
    let outcome = execute_quietly(plan);
    let wall = t0.elapsed().as_secs_f64();
    let (own_after, children_after) = cpu_seconds();
    done.store(true, Ordering::Relaxed);
    let samples = memory.join().unwrap();
    assert_eq!(
        outcome.status,
        OutcomeStatus::Succeeded,
        "{:?}",
        outcome.summary
    );

    let per_rank = RATE * seconds;
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("run.json")).unwrap()).unwrap();
    let received: Vec<u64> = record["attempts"][0]["reports"]
        .as_array()
        .expect("run.json counts each rank's reports")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let sent: Vec<u64> = (0..workers)
        .map(|rank| {
            std::fs::read_to_string(run_dir.join(format!("sent-{rank}")))
                .map_or(0, |s| s.parse().unwrap())
        })
        .collect();
    let times: Vec<f64> = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["time"]
                .as_f64()
                .unwrap()
        })
        .collect();
    let total_sent: u64 = sent.iter().sum();
    let total_received: u64 = received.iter().sum();
    // Rank 0's records are written as they arrive: their times span the sending.
    let sending = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => seconds as f64,
    };
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let early = samples
        .iter()
        .find(|(t, _)| *t >= wall - sending * 0.75)
        .map_or(0, |s| s.1);
    eprintln!(
        "load: {workers} workers x {RATE} records/s for {seconds} s: {total_received} of {total_sent} records received, \
         {} lost; {:.0} records/s accepted while sending ({sending:.2} s); run {wall:.2} s; controller resident memory \
         {:.1} MiB a quarter into the sending, peak {:.1} MiB; controller CPU {:.2} s ({:.0}% of one core over the run), \
         workers' CPU {:.2} s in all",
        total_sent.saturating_sub(total_received),
        total_received as f64 / sending,
        early as f64 / 1024.0,
        peak as f64 / 1024.0,
        own_after - own_before,
        (own_after - own_before) / wall * 100.0,
        children_after - children_before,
    );
    assert!(
        sent.iter().all(|&n| n == per_rank),
        "a worker did not send everything: {sent:?}"
    );
    assert_eq!(received, sent, "records lost");
    assert_eq!(
        times.len() as u64,
        per_rank,
        "rank 0's records in metrics.jsonl"
    );
    // Memory is bounded: records stream to disk (and the report page reads
    // them back one at a time), so the controller's peak stays under 64 MiB
    // however long the run; kept in memory, the 320,000 records of the
    // 5-second run alone would take more than that.
    assert!(
        peak < 64 * 1024,
        "the controller's memory reached {peak} KiB"
    );
}
