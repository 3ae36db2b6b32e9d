//! What workers are told of each checkpoint step: committed, or why it
//! never will be (`meshrun.wait_committed`).

use super::sim::Sim;
use super::*;
use meshrun_protocol::{FromWorker, ToWorker};

/// Every connected worker learns what became of each step it may wait for
/// (`meshrun.wait_committed`, a restore of the newest): committed, or why
/// not, whichever way it failed.
#[test]
fn every_worker_is_told_what_became_of_each_step() {
    let mut sim = Sim::running(2);
    sim.input(Input::Committed {
        step: 2,
        path: "runs/sim/checkpoints/step-2".into(),
    });
    sim.worker(
        1,
        FromWorker::SaveFailed {
            step: 3,
            error: "disk full".into(),
        },
    );
    sim.input(Input::CommitFailed {
        step: 4,
        error: "cannot rename".into(),
    });
    for rank in 0..2u32 {
        let told: Vec<_> = sim
            .sent_to(Conn::from(rank))
            .into_iter()
            .filter(|m| {
                matches!(
                    m,
                    ToWorker::StepCommitted { .. } | ToWorker::StepNotCommitted { .. }
                )
            })
            .cloned()
            .collect();
        assert_eq!(
            told,
            [
                ToWorker::StepCommitted {
                    step: 2,
                    path: "runs/sim/checkpoints/step-2".into()
                },
                ToWorker::StepNotCommitted {
                    step: 3,
                    error: "rank 1 could not write its part: disk full".into()
                },
                ToWorker::StepNotCommitted {
                    step: 4,
                    error: "its commit failed: cannot rename".into()
                },
            ],
            "rank {rank}"
        );
    }
}
