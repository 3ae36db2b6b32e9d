//! A rank out of memory is named as such, with its limit, its peak and
//! what its state needs, whether the kernel killed it or XLA could not
//! allocate; the other ranks are not.

use meshrun_plan::memory_limit::MemoryLimit;
use meshrun_protocol::{FromAgent, FromWorker};
use meshrun_record::failure::OomHow;
use meshrun_record::memory::{MemoryEnd, StateNeed};
use meshrun_record::{Cause, ExitInfo};

use super::sim::{plan, Sim};

const LIMIT: u64 = 1 << 30;

fn limited(nprocs: u32) -> Sim {
    let mut p = plan(nprocs);
    p.memory_per_proc = Some(MemoryLimit(LIMIT));
    Sim::running_with(p)
}

fn need() -> StateNeed {
    StateNeed {
        per_device: 3 << 29,
        parts: vec![("params".into(), 1 << 29), ("opt".into(), 1 << 30)],
        total: 3 << 29,
        mesh: "data=2 fsdp=1 tensor=1".into(),
        fits: "with data=1 fsdp=2 tensor=1 the state is 768 MiB per device".into(),
    }
}

fn killed(sim: &mut Sim, rank: u32, oom_killed: bool) {
    sim.agent(FromAgent::WorkerExited {
        rank,
        exit: ExitInfo {
            code: None,
            signal: Some(9),
        },
        memory: Some(MemoryEnd {
            peak: LIMIT,
            limit: Some(LIMIT),
            oom_killed,
        }),
    });
}

#[test]
fn a_rank_the_kernel_killed_for_memory_is_named_with_its_need() {
    let mut sim = limited(2);
    sim.worker(1, FromWorker::StateNeed { need: need() });
    killed(&mut sim, 1, true);
    let f = sim.failed().unwrap();
    assert_eq!(f.rank, 1);
    let Cause::OutOfMemory {
        host,
        how,
        limit,
        peak,
        need: said,
        ..
    } = &f.cause
    else {
        panic!("{:?}", f.cause)
    };
    assert_eq!((*host, *how), (0, OomHow::Killed));
    assert_eq!((*limit, *peak), (Some(LIMIT), Some(LIMIT)));
    assert_eq!(said.as_ref(), Some(&need()));
    let words = f.cause.headline();
    assert!(
        words.starts_with(
            "ran out of memory on host 0: the kernel's out-of-memory killer ended it at its \
             limit of 1.00 GiB, its peak 1.00 GiB; its state needs 1.50 GiB per device \
             (params 512 MiB, opt 1.00 GiB) on mesh data=2 fsdp=1 tensor=1; with data=1"
        ),
        "{words}"
    );
    // The other rank, stopped by meshrun, is not named.
    killed(&mut sim, 0, false);
    assert_eq!(sim.failed().unwrap().rank, 1);
}

#[test]
fn a_sigkill_without_the_oom_killer_is_an_exit() {
    let mut sim = limited(2);
    killed(&mut sim, 0, false);
    assert!(matches!(sim.failed().unwrap().cause, Cause::Exit { .. }));
}

#[test]
fn resource_exhausted_is_out_of_memory_and_gets_its_peak_at_exit() {
    let mut sim = limited(2);
    sim.worker(
        0,
        FromWorker::Failure {
            kind: "JaxRuntimeError".into(),
            message: "RESOURCE_EXHAUSTED: Out of memory allocating 68719476736 bytes.".into(),
            traceback: "Traceback ...\n  File \"train.py\", line 3".into(),
        },
    );
    let f = sim.failed().unwrap();
    assert_eq!(f.rank, 0);
    let words = f.cause.headline();
    assert!(
        words.starts_with(
            "ran out of memory on host 0: XLA could not allocate under its limit of 1.00 GiB \
             (RESOURCE_EXHAUSTED: Out of memory allocating 68719476736 bytes.); what its \
             state needs per device is not known"
        ),
        "{words}"
    );
    sim.agent(FromAgent::WorkerExited {
        rank: 0,
        exit: ExitInfo {
            code: Some(1),
            signal: None,
        },
        memory: Some(MemoryEnd {
            peak: 300 << 20,
            limit: Some(LIMIT),
            oom_killed: false,
        }),
    });
    let f = sim.failed().unwrap();
    assert!(matches!(
        f.cause,
        Cause::OutOfMemory {
            how: OomHow::Allocation,
            peak: Some(p),
            ..
        } if p == 300 << 20
    ));
    assert!(f
        .cause
        .headline()
        .contains("limit of 1.00 GiB, its peak 300 MiB ("));
}
