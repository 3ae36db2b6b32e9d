//! One function per command.

use std::io::Write;

use meshrun_agent::{self as agent, AgentConfig};
use meshrun_core::controller::progress::ProgressMode;
use meshrun_core::{execute, ExecOptions};
use meshrun_plan::UsageError;
use meshrun_plan::{Elastic, FailurePolicy, RayTarget, Retention, SaveErrorPolicy, ScoreOrder};
use meshrun_plan::{Entry, PlatformChoice, RunSpec, Tee};
use meshrun_protocol::token::Token;

use crate::cli::{
    completion_command, AgentArgs, Cli, Command, OnOffArg, PlatformArg, RunArgs, SaveErrorArg,
    ScoreOrderArg, TeeArg,
};
use crate::{ckpt, join, logs, profile, runs, serve, stop};
use crate::{exit, Launcher};

pub fn dispatch(cli: Cli, launcher: &Launcher) -> i32 {
    match cli.command {
        Command::Run(args) => run(args, launcher),
        Command::Agent(args) => agent(&args),
        Command::Join(args) => join::join(&args),
        Command::Ckpt(cmd) => match ckpt::run(cmd) {
            Ok(()) => exit::SUCCESS,
            Err(e) => {
                error(&e);
                e.exit_code()
            }
        },
        Command::Ls { runs_dir } => finish(runs::ls(&runs_dir)),
        Command::Status { name, runs_dir } => finish(runs::status(&name, &runs_dir)),
        Command::Logs {
            name,
            rank,
            attempt,
            follow,
            runs_dir,
        } => finish(logs::logs(&name, &runs_dir, rank, attempt, follow)),
        Command::Report { name, runs_dir } => finish(runs::report(&name, &runs_dir)),
        Command::Stop {
            name,
            now,
            runs_dir,
        } => stop::stop(&name, &runs_dir, now),
        Command::Profile {
            name,
            steps,
            ranks,
            runs_dir,
        } => profile::profile(&name, &runs_dir, steps, ranks),
        Command::Serve {
            runs_dir,
            host,
            port,
        } => serve::serve(runs_dir, host, port),
        Command::Completion { shell } => completion(shell),
    }
}

/// Generated into memory first: `clap_complete` panics on a failed write,
/// and `meshrun completion bash | head` closes the pipe early.
fn completion(shell: clap_complete::Shell) -> i32 {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut completion_command(), "meshrun", &mut script);
    let _ = std::io::stdout().lock().write_all(&script);
    exit::SUCCESS
}

fn finish(result: Result<(), runs::RunsError>) -> i32 {
    match result {
        Ok(()) => exit::SUCCESS,
        Err(e) => {
            error(&e);
            e.exit_code()
        }
    }
}

pub(crate) fn error(text: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "meshrun: error: {text}");
}

/// Builds the run's spec from the command line.
pub fn spec(args: RunArgs, launcher: &Launcher) -> Result<RunSpec, UsageError> {
    let elastic = match args.hosts.min {
        Some(min_hosts) => Some(Elastic {
            min_hosts,
            rejoin_timeout_s: args.rejoin_timeout,
            any_count: args.any_host_count,
        }),
        None if args.rejoin_timeout.is_some() || args.any_host_count => {
            return Err(UsageError::ElasticOptionsWithoutRange)
        }
        None => None,
    };
    let retention =
        (args.keep_checkpoints.is_some() || args.keep_every_n_steps.is_some()).then(|| Retention {
            num_to_keep: args.keep_checkpoints,
            keep_every_n_steps: args.keep_every_n_steps,
            score_attribute: args.checkpoint_score.clone(),
            score_order: match args.checkpoint_score_order {
                ScoreOrderArg::Max => ScoreOrder::Max,
                ScoreOrderArg::Min => ScoreOrder::Min,
            },
        });
    let mut program = args.program.into_iter();
    let first = program.next().unwrap_or_default();
    let rest: Vec<String> = program.collect();
    let entry = if args.module {
        Entry::Module {
            name: first,
            args: rest,
        }
    } else {
        Entry::Script {
            path: first.into(),
            args: rest,
        }
    };
    Ok(RunSpec {
        nprocs: args.nprocs,
        hosts: args.hosts.max,
        devices_per_proc: args.devices_per_proc,
        gpus_per_proc: args.gpus_per_proc,
        cpus_per_proc: None,
        memory_per_proc: args.memory_per_proc,
        platform: match args.platform {
            PlatformArg::Cpu => PlatformChoice::Cpu,
            PlatformArg::Cuda => PlatformChoice::Cuda,
            PlatformArg::Auto => PlatformChoice::Auto,
        },
        name: args.name,
        runs_dir: args.runs_dir,
        tee: match args.tee {
            TeeArg::Rank0 => Tee::Rank0,
            TeeArg::All => Tee::All,
            TeeArg::None => Tee::None,
        },
        entry: Some(entry),
        python: launcher
            .python
            .clone()
            .or_else(|| std::env::var_os("MESHRUN_PYTHON").map(Into::into))
            .unwrap_or_else(|| "python3".into()),
        agent_command: launcher.agent_command.clone(),
        env: vec![],
        retention,
        checkpoint_every: args.checkpoint_every,
        recovery: meshrun_plan::Recovery {
            memory_every: args.memory_checkpoint_every,
            warm_spares: args.warm_spares.map(|s| s == OnOffArg::On),
            spare_imports: args.spare_imports,
        },
        on_save_error: match args.on_save_error {
            SaveErrorArg::Continue => SaveErrorPolicy::Continue,
            SaveErrorArg::Fail => SaveErrorPolicy::Fail,
        },
        tensorboard: args.tensorboard,
        loss_metric: args.loss_metric.clone(),
        metrics_file: args.metrics_file.clone(),
        failure: FailurePolicy {
            max_failures: args.max_failures,
            hang_timeout_s: args.hang_timeout,
            finish_timeout_s: args.finish_timeout,
            start_timeout_s: args.start_timeout,
        },
        ray: args.ray.map(|address| RayTarget {
            address,
            strategy: args.ray_strategy.to_uppercase(),
        }),
        control_host: args.control_host,
        control_port: args.control_port,
        resume_from: args.resume_from,
        storage: args.storage,
        listen: args.listen,
        join_timeout_s: args.join_timeout,
        elastic,
        observe: meshrun_plan::Observe {
            straggler_threshold: args.straggler_threshold,
            straggler_steps: args.straggler_steps,
            profile_stragglers: args.profile_stragglers,
            profile_steps: args.profile_steps,
        },
    })
}

fn run(args: RunArgs, launcher: &Launcher) -> i32 {
    let quiet = args.quiet;
    let plan = match spec(args, launcher).and_then(RunSpec::validate) {
        Ok(plan) => plan,
        Err(e) => {
            error(e);
            return exit::USAGE;
        }
    };
    let opts = ExecOptions {
        handle_signals: true,
        progress: if quiet {
            ProgressMode::Off
        } else {
            ProgressMode::Auto
        },
        ..ExecOptions::default()
    };
    match execute(plan, opts) {
        Ok(outcome) => {
            // The engine does not draw: the page is made here, once the
            // run has ended, from what its folder holds.
            runs::report_after_run(&outcome.run_dir);
            if let Some(summary) = &outcome.summary {
                let _ = writeln!(std::io::stderr().lock(), "{summary}");
            }
            outcome.exit_code()
        }
        Err(e) => {
            let code = e.exit_code();
            error(e);
            code
        }
    }
}

fn agent(args: &AgentArgs) -> i32 {
    let token = match Token::from_hex(&args.token) {
        Ok(t) => t,
        Err(e) => {
            error(e);
            return exit::USAGE;
        }
    };
    let cfg = AgentConfig {
        controller: args.controller,
        token,
        host: Some(args.host),
        host_ip: Some(args.host_ip),
        scratch: agent::scratch_root(),
        // This agent lives for one attempt: spares would die with it.
        spares: None,
        news: None,
        rejoining: false,
    };
    let runtime = match agent::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            error(e);
            return exit::FAILURE;
        }
    };
    match runtime.block_on(agent::run(&cfg)) {
        Ok(_) => exit::SUCCESS,
        Err(e) => {
            error(e);
            exit::FAILURE
        }
    }
}
