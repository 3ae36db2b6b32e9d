//! One session of an agent with the controller, as decisions apart from
//! I/O (as the controller's `meshrun-machine` is): what the controller
//! says, what the host's workers and background jobs report and each
//! heartbeat's moment go in as [`Input`]s; what to send, start, stop,
//! commit, tell and when the session ends come out as [`Action`]s, which
//! the driver in `lib.rs` carries out (sockets, processes, files). Tested
//! without any of them.

use std::collections::VecDeque;
use std::net::SocketAddr;

use meshrun_protocol::message::SpawnProblem;
use meshrun_protocol::{FromAgent, ToAgent, WorkerLaunch};

use crate::news::News;
use crate::steps::ClockOffset;
use crate::Ended;

/// What happens to a session.
#[derive(Debug)]
pub enum Input {
    /// A message of the controller, read when this host's clock said
    /// `now_ns`.
    Controller { msg: ToAgent, now_ns: i64 },
    /// Reading the controller's connection failed: it is gone.
    ReadFailed(String),
    /// Sending to it failed (what it sent before may still be readable).
    SendFailed,
    /// A heartbeat's moment: `beats`, the ranks whose heartbeat file moved
    /// since the last (`None` before a launch); `now_ns`, this host's clock.
    Tick {
        beats: Option<Vec<u32>>,
        now_ns: i64,
    },
}

/// What the driver is to do, in order.
#[derive(Debug, PartialEq)]
pub enum Action {
    Send(FromAgent),
    /// Read the storage marker at `path` and answer `StorageChecked`.
    CheckStorage {
        path: String,
        expect: String,
    },
    /// Start these workers of `attempt` (`function`: the function of
    /// `Trainer.fit` to write first, or why it cannot be), with warm
    /// spares importing `spares` when given.
    Launch {
        attempt: u32,
        run_id: String,
        workers: Vec<WorkerLaunch>,
        spares: Option<Vec<String>>,
        function: Result<Vec<u8>, String>,
    },
    /// Make memory checkpoint `step` of this host ready (its own copy, else
    /// the buddy's replica), then answer `MemoryPrepared`.
    PrepareMemory {
        run_id: String,
        step: u64,
        buddy: Option<String>,
    },
    /// Commit this host's part of memory checkpoint `step` with
    /// `manifest`, send the replica to `buddy`, then answer `MemoryHeld`.
    CommitMemory {
        run_id: String,
        manifest: meshrun_record::manifest::Manifest,
        buddy: Option<String>,
    },
    /// Older memory checkpoints than `step` can go.
    ReleaseMemory {
        step: u64,
    },
    /// The attempt trains: start the next warm spares now.
    RefillSpares,
    /// Stop every worker of the host.
    StopWorkers {
        grace_ms: u64,
        dump_stacks: bool,
    },
    /// Read the steps the workers reached since the last time and send
    /// them (`StepTimes`, on the controller's clock: `offset_ns`).
    SendStepTimes {
        offset_ns: i64,
    },
    /// For a person watching (`meshrun join`).
    Tell(News),
    /// The controller refused this host (the run has all its hosts, its
    /// rank is taken or out of range): the agent gives up, saying why.
    Refused(String),
    /// The session is over. With `Lost` after a failed send, the driver
    /// first reads whether the controller had said `Shutdown`.
    End(Ended),
}

/// The session's state.
#[derive(Debug)]
pub struct Session {
    controller: SocketAddr,
    rejoining: bool,
    host: Option<u32>,
    run_name: String,
    /// The function as its parts come; a part that does not decode fails
    /// the launch with the reason rather than start workers on half a file.
    function: Result<Vec<u8>, String>,
    buddy: Option<String>,
    /// The launched attempt's run id: its memory tier is this host's.
    memory_run: Option<String>,
    launched: Option<u32>,
    ticks: u64,
    clock: ClockOffset,
    ended: Option<Ended>,
    /// The session gave no `End` but is over (refused).
    refused: bool,
    actions: VecDeque<Action>,
}

impl Session {
    pub fn new(controller: SocketAddr, host: Option<u32>, rejoining: bool) -> Self {
        Self {
            controller,
            rejoining,
            host,
            run_name: String::new(),
            function: Ok(Vec::new()),
            buddy: None,
            memory_run: None,
            launched: None,
            ticks: 0,
            clock: ClockOffset::default(),
            ended: None,
            refused: false,
            actions: VecDeque::new(),
        }
    }

    pub fn host(&self) -> Option<u32> {
        self.host
    }

    #[cfg(test)]
    pub fn run_name(&self) -> &str {
        &self.run_name
    }

    /// The attempt whose workers this session started, if any.
    #[cfg(test)]
    pub fn launched(&self) -> Option<u32> {
        self.launched
    }

    /// Add to this host's times to get the controller's.
    pub fn clock_offset_ns(&self) -> i64 {
        self.clock.offset_ns()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether the session has ended (its `End` action was given).
    pub fn is_over(&self) -> bool {
        self.ended.is_some() || self.refused
    }

    pub fn handle(&mut self, input: Input) {
        if self.is_over() {
            return;
        }
        match input {
            Input::Controller { msg, now_ns } => self.on_controller(msg, now_ns),
            Input::ReadFailed(why) => {
                self.tell_lost(why);
                self.end(Ended::Lost);
            }
            Input::SendFailed => self.end(Ended::Lost),
            Input::Tick { beats, now_ns } => self.tick(beats, now_ns),
        }
    }

    /// After a failed send, what the controller had said before the
    /// connection broke (`Shutdown`'s again and state), if it said it.
    pub fn last_words(&mut self, shutdown: Option<(bool, Option<String>)>, why: &str) -> Ended {
        let ended = match shutdown {
            Some((true, _)) => {
                self.attempt_over();
                Ended::Again
            }
            Some((false, state)) => Ended::Over(state),
            None => {
                self.tell_lost(why.to_string());
                Ended::Lost
            }
        };
        self.ended = Some(ended.clone());
        ended
    }

    /// Everything the session's end says once the workers are gone.
    pub fn finish(&mut self) {
        if let Some(Ended::Over(state)) = &self.ended {
            self.actions.push_back(Action::Tell(News::Over {
                run: self.run_name.clone(),
                state: state.clone(),
            }));
        }
    }

    /// The connection is lost: news, unless the controller never took
    /// this host on (a join still being tried, as the previous attempt's
    /// listener closes under a host that rejoins at once).
    fn tell_lost(&mut self, why: String) {
        if !self.run_name.is_empty() {
            self.actions.push_back(Action::Tell(News::Lost {
                controller: self.controller,
                attempt: self.launched,
                why,
            }));
        }
    }

    fn end(&mut self, ended: Ended) {
        self.actions.push_back(Action::End(ended.clone()));
        self.ended = Some(ended);
    }

    fn attempt_over(&mut self) {
        if let Some(attempt) = self.launched {
            self.actions
                .push_back(Action::Tell(News::AttemptOver { attempt }));
        }
    }

    fn on_controller(&mut self, msg: ToAgent, now_ns: i64) {
        match msg {
            ToAgent::HostAssigned { host, run } => {
                self.host = Some(host);
                self.run_name = run;
                if !self.rejoining {
                    self.actions.push_back(Action::Tell(News::Joined {
                        run: self.run_name.clone(),
                        controller: self.controller,
                        host,
                    }));
                }
            }
            ToAgent::Refused { reason } => {
                self.refused = true;
                self.actions.push_back(Action::Refused(reason));
            }
            ToAgent::CheckStorage { path, expect } => {
                self.actions
                    .push_back(Action::CheckStorage { path, expect });
            }
            ToAgent::FunctionPart { data, last: _ } => {
                if let Ok(bytes) = &mut self.function {
                    if let Err(e) = crate::scratch::append_base64(bytes, &data) {
                        self.function = Err(format!(
                            "the function sent by the controller did not decode: {e}"
                        ));
                    }
                }
            }
            ToAgent::Launch {
                attempt,
                run_id,
                workers,
                spares,
            } => {
                self.memory_run = Some(run_id.clone());
                self.launched = Some(attempt);
                let function = std::mem::replace(&mut self.function, Ok(Vec::new()));
                self.actions.push_back(Action::Launch {
                    attempt,
                    run_id,
                    workers,
                    spares,
                    function,
                });
            }
            ToAgent::ClockEcho {
                sent_ns,
                controller_ns,
            } => self.clock.sample(sent_ns, controller_ns, now_ns),
            ToAgent::Buddy { host: _, addr } => self.buddy = Some(addr),
            ToAgent::MemoryPrepare { run_id, step } => {
                self.actions.push_back(Action::PrepareMemory {
                    run_id,
                    step,
                    buddy: self.buddy.clone(),
                });
            }
            ToAgent::MemoryCommit { step, manifest } => {
                if let Some(run_id) = self.memory_run.clone() {
                    self.actions.push_back(Action::CommitMemory {
                        run_id,
                        manifest,
                        buddy: self.buddy.clone(),
                    });
                } else {
                    self.actions.push_back(Action::Send(FromAgent::MemoryHeld {
                        step,
                        bytes: 0,
                        replicated: false,
                        error: Some("no attempt was launched here".into()),
                    }));
                }
            }
            ToAgent::MemoryRelease { step } => {
                if self.memory_run.is_some() {
                    self.actions.push_back(Action::ReleaseMemory { step });
                }
            }
            ToAgent::Training => self.actions.push_back(Action::RefillSpares),
            ToAgent::Stop {
                grace_ms,
                dump_stacks,
            } => self.actions.push_back(Action::StopWorkers {
                grace_ms,
                dump_stacks,
            }),
            ToAgent::Shutdown { again, state } => {
                if again {
                    self.attempt_over();
                    self.end(Ended::Again);
                } else {
                    self.end(Ended::Over(state));
                }
            }
        }
    }

    /// Once a second: the host's workers' heartbeats (or its own), a clock
    /// probe when one is due, and the steps reached since.
    fn tick(&mut self, beats: Option<Vec<u32>>, now_ns: i64) {
        self.ticks += 1;
        let beat = match beats {
            Some(ranks) if !ranks.is_empty() => FromAgent::WorkerBeats { ranks },
            _ => FromAgent::Heartbeat,
        };
        self.actions.push_back(Action::Send(beat));
        if self.clock.due(self.ticks) {
            self.actions
                .push_back(Action::Send(FromAgent::ClockProbe { sent_ns: now_ns }));
        }
        if self.launched.is_some() {
            self.actions.push_back(Action::SendStepTimes {
                offset_ns: self.clock.offset_ns(),
            });
        }
    }
}

/// A worker that could not be given what it needs to start (the function
/// did not arrive whole): it is reported as not started.
pub fn not_started(rank: u32, error: String) -> FromAgent {
    FromAgent::SpawnFailed {
        rank,
        error,
        problem: SpawnProblem::Other,
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
