//! The agent's session without sockets or processes.

use meshrun_protocol::{FromAgent, ToAgent, WorkerLaunch};

use super::*;

const CONTROLLER: &str = "10.0.0.1:29400";

fn session(host: Option<u32>, rejoining: bool) -> Session {
    Session::new(CONTROLLER.parse().unwrap(), host, rejoining)
}

fn say(s: &mut Session, msg: ToAgent) -> Vec<Action> {
    s.handle(Input::Controller { msg, now_ns: 0 });
    std::iter::from_fn(|| s.poll_action()).collect()
}

fn launch(attempt: u32) -> ToAgent {
    ToAgent::Launch {
        attempt,
        run_id: "r1".into(),
        workers: vec![WorkerLaunch {
            rank: 0,
            argv: vec!["python3".into()],
            env: vec![],
            cwd: ".".into(),
        }],
        spares: None,
    }
}

#[test]
fn a_joined_host_is_told_its_rank_once_and_a_refusal_ends_the_session() {
    let mut s = session(None, false);
    let acts = say(
        &mut s,
        ToAgent::HostAssigned {
            host: 2,
            run: "gpt".into(),
        },
    );
    assert_eq!(
        acts,
        [Action::Tell(News::Joined {
            run: "gpt".into(),
            controller: CONTROLLER.parse().unwrap(),
            host: 2
        })]
    );
    assert_eq!((s.host(), s.run_name()), (Some(2), "gpt"));
    // A host that rejoins says nothing new.
    let mut again = session(None, true);
    assert!(say(
        &mut again,
        ToAgent::HostAssigned {
            host: 2,
            run: "gpt".into()
        }
    )
    .is_empty());
    let mut refused = session(None, false);
    let acts = say(
        &mut refused,
        ToAgent::Refused {
            reason: "the run has all its hosts".into(),
        },
    );
    assert_eq!(acts, [Action::Refused("the run has all its hosts".into())]);
    assert!(refused.is_over());
    assert!(
        say(&mut refused, launch(1)).is_empty(),
        "nothing after the end"
    );
}

#[test]
fn the_function_comes_in_parts_and_one_that_does_not_decode_fails_the_launch() {
    let mut s = session(Some(0), false);
    say(
        &mut s,
        ToAgent::FunctionPart {
            data: "aGVs".into(),
            last: false,
        },
    );
    say(
        &mut s,
        ToAgent::FunctionPart {
            data: "bG8=".into(),
            last: true,
        },
    );
    let acts = say(&mut s, launch(1));
    assert!(
        matches!(&acts[..], [Action::Launch { attempt: 1, function: Ok(f), .. }] if f == b"hello"),
        "{acts:?}"
    );
    assert_eq!(s.launched(), Some(1));
    // The next attempt's function starts afresh; a bad part spoils it.
    say(
        &mut s,
        ToAgent::FunctionPart {
            data: "not base64!".into(),
            last: true,
        },
    );
    let acts = say(&mut s, launch(2));
    assert!(
        matches!(&acts[..], [Action::Launch { function: Err(e), .. }] if e.contains("did not decode")),
        "{acts:?}"
    );
}

#[test]
fn memory_checkpoints_need_a_launch_and_go_to_the_buddy_named() {
    let manifest = meshrun_record::manifest::Manifest {
        format: 1,
        step: 4,
        leaves: vec![],
        files: vec![],
        extra: serde_json::Value::Null,
        attempt: Some(1),
    };
    let mut s = session(Some(0), false);
    let acts = say(
        &mut s,
        ToAgent::MemoryCommit {
            step: 4,
            manifest: manifest.clone(),
        },
    );
    assert!(
        matches!(&acts[..], [Action::Send(FromAgent::MemoryHeld { step: 4, error: Some(e), .. })] if e.contains("no attempt")),
        "{acts:?}"
    );
    assert!(say(&mut s, ToAgent::MemoryRelease { step: 4 }).is_empty());
    say(
        &mut s,
        ToAgent::Buddy {
            host: 1,
            addr: "10.0.0.2:7000".into(),
        },
    );
    say(&mut s, launch(1));
    let acts = say(
        &mut s,
        ToAgent::MemoryCommit {
            step: 4,
            manifest: manifest.clone(),
        },
    );
    assert_eq!(
        acts,
        [Action::CommitMemory {
            run_id: "r1".into(),
            manifest,
            buddy: Some("10.0.0.2:7000".into())
        }]
    );
    assert_eq!(
        say(&mut s, ToAgent::MemoryRelease { step: 4 }),
        [Action::ReleaseMemory { step: 4 }]
    );
    assert_eq!(
        say(
            &mut s,
            ToAgent::MemoryPrepare {
                run_id: "r2".into(),
                step: 4
            }
        ),
        [Action::PrepareMemory {
            run_id: "r2".into(),
            step: 4,
            buddy: Some("10.0.0.2:7000".into())
        }]
    );
}

#[test]
fn a_shutdown_with_another_attempt_says_the_attempt_is_over_and_ends_again() {
    let mut s = session(Some(1), false);
    say(
        &mut s,
        ToAgent::HostAssigned {
            host: 1,
            run: "gpt".into(),
        },
    );
    say(&mut s, launch(3));
    let acts = say(
        &mut s,
        ToAgent::Shutdown {
            again: true,
            state: None,
        },
    );
    assert_eq!(
        acts,
        [
            Action::Tell(News::AttemptOver { attempt: 3 }),
            Action::End(Ended::Again)
        ]
    );
    let mut s = session(Some(1), false);
    let acts = say(
        &mut s,
        ToAgent::Shutdown {
            again: false,
            state: Some("succeeded".into()),
        },
    );
    assert_eq!(acts, [Action::End(Ended::Over(Some("succeeded".into())))]);
    s.finish();
    assert!(matches!(
        s.poll_action(),
        Some(Action::Tell(News::Over { state: Some(st), .. })) if st == "succeeded"
    ));
}

#[test]
fn a_lost_connection_is_news_only_once_the_controller_took_the_host() {
    let mut s = session(None, false);
    s.handle(Input::ReadFailed("reset".into()));
    let acts: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert_eq!(acts, [Action::End(Ended::Lost)], "a join still being tried");
    let mut s = session(None, false);
    say(
        &mut s,
        ToAgent::HostAssigned {
            host: 1,
            run: "gpt".into(),
        },
    );
    say(&mut s, launch(2));
    s.handle(Input::ReadFailed("reset".into()));
    let acts: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert!(
        matches!(&acts[..], [Action::Tell(News::Lost { attempt: Some(2), why, .. }), Action::End(Ended::Lost)] if why == "reset"),
        "{acts:?}"
    );
}

#[test]
fn after_a_failed_send_the_shutdown_read_afterwards_decides_the_end() {
    let mut s = session(Some(0), false);
    say(
        &mut s,
        ToAgent::HostAssigned {
            host: 0,
            run: "gpt".into(),
        },
    );
    say(&mut s, launch(1));
    s.handle(Input::SendFailed);
    assert_eq!(s.poll_action(), Some(Action::End(Ended::Lost)));
    assert_eq!(s.last_words(Some((true, None)), "x"), Ended::Again);
    assert_eq!(
        s.poll_action(),
        Some(Action::Tell(News::AttemptOver { attempt: 1 }))
    );
    let mut s = session(Some(0), false);
    s.handle(Input::SendFailed);
    let _ = s.poll_action();
    assert_eq!(
        s.last_words(Some((false, Some("failed".into()))), "x"),
        Ended::Over(Some("failed".into()))
    );
    assert_eq!(s.last_words(None, "it broke"), Ended::Lost);
}

#[test]
fn each_heartbeat_carries_the_workers_beats_a_due_probe_and_the_steps_once_launched() {
    let mut s = session(Some(0), false);
    s.handle(Input::Tick {
        beats: None,
        now_ns: 5,
    });
    let acts: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert_eq!(
        acts,
        [
            Action::Send(FromAgent::Heartbeat),
            Action::Send(FromAgent::ClockProbe { sent_ns: 5 })
        ]
    );
    say(&mut s, launch(1));
    // An answer 10 ns later from a controller 1000 ns ahead.
    s.handle(Input::Controller {
        msg: ToAgent::ClockEcho {
            sent_ns: 5,
            controller_ns: 1010,
        },
        now_ns: 15,
    });
    assert_eq!(s.clock_offset_ns(), 1000);
    s.handle(Input::Tick {
        beats: Some(vec![0, 1]),
        now_ns: 20,
    });
    let acts: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert_eq!(
        acts,
        [
            Action::Send(FromAgent::WorkerBeats { ranks: vec![0, 1] }),
            Action::Send(FromAgent::ClockProbe { sent_ns: 20 }),
            Action::SendStepTimes { offset_ns: 1000 }
        ]
    );
    // Once the first probes are in, one heartbeat in ten probes.
    for _ in 0..4 {
        s.handle(Input::Controller {
            msg: ToAgent::ClockEcho {
                sent_ns: 5,
                controller_ns: 1010,
            },
            now_ns: 15,
        });
    }
    s.handle(Input::Tick {
        beats: Some(vec![]),
        now_ns: 30,
    });
    let acts: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert_eq!(
        acts,
        [
            Action::Send(FromAgent::Heartbeat),
            Action::SendStepTimes { offset_ns: 1000 }
        ]
    );
}
