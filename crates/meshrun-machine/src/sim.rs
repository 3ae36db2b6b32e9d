//! A machine on a simulated clock, for the tests: the clock moves only
//! when told, and the driver is one that wakes exactly when asked.

use meshrun_protocol::{FromAgent, FromWorker, ToAgent};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use meshrun_record::{Event, ExitInfo, FailureRecord};
use serde_json::json;

use crate::{Action, Conn, Input, Machine, Outgoing, RunPlan, Setup, AGENT_JOIN_TIMEOUT};
use meshrun_plan::{Entry, FailurePolicy, Platform, Tee};

pub const AGENT: Conn = 1000;
pub const STOP_CLIENT: Conn = 2000;

pub fn plan(nprocs: u32) -> RunPlan {
    RunPlan {
        name: "sim".into(),
        run_dir: PathBuf::from("runs/sim"),
        nprocs,
        hosts: 1,
        procs_per_host: nprocs,
        platform: Platform::Cpu,
        devices_per_proc: 1,
        gpus_per_proc: 0,
        cpus_per_proc: None,
        memory_per_proc: None,
        tee: Tee::Rank0,
        entry: Entry::Script {
            path: "train.py".into(),
            args: vec![],
        },
        cwd: PathBuf::from("."),
        python: PathBuf::from("python3"),
        agent_command: vec![],
        env: vec![],
        retention: None,
        checkpoint_every: None,
        recovery: meshrun_plan::Recovery::default(),
        on_save_error: meshrun_plan::SaveErrorPolicy::Continue,
        tensorboard: false,
        loss_metric: None,
        metrics_file: None,
        failure: FailurePolicy::default(),
        ray: None,
        control_host: std::net::Ipv4Addr::LOCALHOST.into(),
        control_port: 0,
        resume_from: None,
        storage: None,
        storage_dir_text: "runs/sim".into(),
        rendezvous: false,
        join_timeout_s: None,
        elastic: None,
        observe: meshrun_plan::Observe::default(),
    }
}

/// A machine and a clock that only moves when told.
pub struct Sim {
    pub m: Machine,
    pub t0: Instant,
    pub now: Instant,
    pub actions: Vec<Action>,
}

impl Sim {
    pub fn new(plan: RunPlan) -> Self {
        let setup = Setup {
            attempt: 1,
            run_id: "0123456789abcdef".into(),
            token_hex: "00".repeat(32),
            control_addr: "127.0.0.1:4000".into(),
            user_xla_flags: None,
            resume_step: None,
            join_timeout: AGENT_JOIN_TIMEOUT,
            payload: None,
            storage_probe: None,
            first_joined_host: 0,
            memory_step: None,
            previous_hosts: None,
            expected_hosts: None,
            resize_reason: None,
        };
        Self::with_setup(plan, setup)
    }

    pub fn with_setup(plan: RunPlan, setup: Setup) -> Self {
        let t0 = Instant::now();
        Self {
            m: Machine::new(plan, setup, t0),
            t0,
            now: t0,
            actions: Vec::new(),
        }
    }

    /// Launched, every worker started and connected on conn = its rank.
    pub fn running(nprocs: u32) -> Self {
        Self::running_with(plan(nprocs))
    }

    pub fn running_with(plan: RunPlan) -> Self {
        let n = plan.nprocs;
        let mut sim = Self::new(plan);
        sim.join_agent();
        assert!(sim.m.launched());
        for rank in 0..n {
            sim.start_worker(AGENT, rank, Conn::from(rank));
        }
        sim.take();
        sim
    }

    /// Rank `rank`'s worker started (its agent on `agent` said so, pid
    /// 100 + rank) and joined on connection `conn`.
    pub fn start_worker(&mut self, agent: Conn, rank: u32, conn: Conn) {
        self.input(Input::FromAgent {
            conn: agent,
            msg: FromAgent::WorkerStarted {
                rank,
                pid: 100 + rank,
                warm: false,
            },
        });
        self.input(Input::WorkerJoined {
            rank,
            attempt: 1,
            pid: 100 + rank,
            conn,
        });
    }

    /// The one agent (host 0) connects.
    pub fn join_agent(&mut self) {
        self.join_host(AGENT, Some(0), "127.0.0.1");
    }

    /// An agent connects on `conn`, asking for rank `host` (or any).
    pub fn join_host(&mut self, conn: Conn, host: Option<u32>, ip: &str) {
        self.input(Input::AgentJoined {
            host,
            ip: ip.into(),
            pid: 10,
            gpus: vec![],
            free_port: 5000,
            controller: None,
            replica_port: None,
            conn,
        });
    }

    pub fn secs(&self) -> f64 {
        (self.now - self.t0).as_secs_f64()
    }

    pub fn input(&mut self, input: Input) {
        self.m.handle(self.now, input).expect("no engine error");
        self.actions.extend(self.m.drain_actions());
    }

    pub fn agent(&mut self, msg: FromAgent) {
        self.input(Input::FromAgent { conn: AGENT, msg });
    }

    pub fn worker(&mut self, rank: u32, msg: FromWorker) {
        self.input(Input::FromWorker { rank, msg });
    }

    pub fn exit(&mut self, rank: u32, code: i32) {
        self.agent(FromAgent::WorkerExited {
            rank,
            exit: ExitInfo {
                code: Some(code),
                signal: None,
            },
            memory: None,
        });
    }

    pub fn report(&mut self, rank: u32, step: u64, checkpoint: bool) {
        self.worker(
            rank,
            FromWorker::Report {
                step: Some(step),
                metrics: json!({ "loss": 1.0 / (step as f64 + 1.0) }),
                checkpoint,
                timing: None,
                saving: false,
                total_steps: None,
            },
        );
    }

    /// Every agent and every rank sends a heartbeat now.
    pub fn heartbeats(&mut self) {
        let agents: Vec<Conn> = self.m.agents.values().map(|a| a.conn).collect();
        for conn in agents {
            self.input(Input::FromAgent {
                conn,
                msg: FromAgent::Heartbeat,
            });
        }
        for rank in 0..self.m.ranks.len() as u32 {
            if !self.m.ranks[rank as usize].done {
                self.worker(rank, FromWorker::Heartbeat);
            }
        }
    }

    /// Moves the clock to `secs`, waking exactly when the machine asks to,
    /// as a driver that is never late does.
    pub fn until(&mut self, secs: f64) {
        let target = self.t0 + Duration::from_secs_f64(secs);
        loop {
            match self.m.poll_timeout() {
                Some(wake) if wake <= target => {
                    self.now = self.now.max(wake);
                    self.m.handle_timeout(self.now).expect("no engine error");
                    self.actions.extend(self.m.drain_actions());
                }
                _ => break,
            }
        }
        self.now = target;
    }

    /// Moves the clock to `secs` with heartbeats every second, as live
    /// workers send them.
    pub fn alive_until(&mut self, secs: f64) {
        while self.secs() + 1.0 <= secs {
            let next = self.secs() + 1.0;
            self.until(next);
            self.heartbeats();
        }
        self.until(secs);
    }

    /// Every message sent on `conn` so far (since the last `take`).
    /// What was sent on `conn`, as messages of `M`'s conversation.
    pub fn sent_to<M: crate::outgoing::Sent>(&self, conn: Conn) -> Vec<&M> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { to, msg } if *to == conn => M::of(msg),
                _ => None,
            })
            .collect()
    }

    pub fn take(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    pub fn events(&self) -> Vec<&Event> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Record(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// A second at a time for up to `seconds`, heartbeats from rank 0 and
    /// the agent only (rank 1 is silent), until the attempt fails; the
    /// failure.
    pub fn only_rank_0_heard(&mut self, seconds: u32) -> Option<FailureRecord> {
        for _ in 0..seconds {
            let next = self.secs() + 1.0;
            self.until(next);
            if self.failed().is_some() {
                break;
            }
            self.worker(0, FromWorker::Heartbeat);
            self.agent(FromAgent::Heartbeat);
        }
        self.failed()
    }

    pub fn failed(&self) -> Option<FailureRecord> {
        self.m.failure()
    }

    pub fn stops_sent(&self) -> Vec<(u64, bool)> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    to: AGENT,
                    msg:
                        Outgoing::Agent(ToAgent::Stop {
                            grace_ms,
                            dump_stacks,
                        }),
                } => Some((*grace_ms, *dump_stacks)),
                _ => None,
            })
            .collect()
    }

    pub fn finished(&self) -> bool {
        self.m.is_finished(self.now)
    }
}
