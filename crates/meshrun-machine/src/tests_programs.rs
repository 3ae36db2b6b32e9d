//! The flight recorder's verdicts as the machine gives them: ranks whose
//! calls of programs across processes part fail the attempt at once, and
//! for good (see `programs.rs` for the comparison itself).

use meshrun_protocol::FromWorker;
use meshrun_record::Cause;

use super::sim::Sim;
use super::Input;

/// A rank's call `n` of the program `fingerprint` (0: its recorder is on).
fn call(n: u64, fingerprint: &str) -> FromWorker {
    FromWorker::Call {
        n,
        fingerprint: fingerprint.into(),
        site: "train.py:12".into(),
    }
}

#[test]
fn ranks_whose_programs_part_fail_the_attempt_at_once_for_good() {
    use meshrun_record::program::Program;
    let mut sim = Sim::running(2);
    for (rank, fp, args) in [(0, "a", "f32[16,4]"), (1, "b", "f32[14,4]")] {
        sim.worker(rank, call(0, ""));
        sim.worker(
            rank,
            FromWorker::Program {
                program: Program {
                    fingerprint: fp.into(),
                    name: "jit_step".into(),
                    args: args.into(),
                    size: 20,
                    collectives: vec!["all-reduce f32[]".into()],
                    site: "train.py:12".into(),
                    values: Vec::new(),
                },
            },
        );
    }
    sim.worker(0, call(1, "a"));
    assert!(sim.failed().is_none());
    sim.worker(1, call(1, "b"));
    let f = sim.failed().expect("parted");
    assert_eq!(f.rank, 1);
    assert!(matches!(
        f.cause,
        Cause::ProgramsParted {
            call: 1,
            other: 0,
            ..
        }
    ));
    assert!(
        f.cause.restart_cannot_change(),
        "the same program parts again"
    );
    assert!(
        f.cause
            .headline()
            .contains("jit_step with other arguments (f32[14,4] against f32[16,4])"),
        "{}",
        f.cause.headline()
    );
}

#[test]
fn a_rank_left_in_a_call_by_a_finished_one_is_named_at_its_finish() {
    let mut sim = Sim::running(2);
    for n in 0..=3 {
        sim.worker(0, call(n, "a"));
    }
    for n in 0..=2 {
        sim.worker(1, call(n, "a"));
    }
    sim.worker(1, FromWorker::Bye);
    sim.input(Input::WorkerLost {
        rank: 1,
        clean: true,
    });
    let f = sim.failed().expect("rank 0 waits for rank 1 forever");
    assert_eq!(f.rank, 0);
    assert!(matches!(
        f.cause,
        Cause::ProgramsParted {
            call: 3,
            other: 1,
            ..
        }
    ));
}
