//! Command-line grammar (clap). Nothing here runs anything.

// The doc comments are the help text users read: URLs stay as typed.
#![allow(clippy::doc_markdown)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use meshrun_plan::memory_limit::MemoryLimit;

#[derive(Debug, Parser)]
#[command(
    name = "meshrun",
    version,
    about = "Run one sharded JAX program as N cooperating processes",
    propagate_version = true
)]
pub struct Cli {
    /// More log output from meshrun itself (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of `run`'s arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch and supervise a JAX program on N processes.
    Run(RunArgs),
    /// Join a run started with `meshrun run --hosts H --listen ADDR:PORT`
    /// as one of its hosts (Slurm, SSH, Kubernetes, bare machines). The run
    /// token comes from `MESHRUN_TOKEN` or --token-file, never the command line.
    Join(JoinArgs),
    /// Run a host's agent (started by `meshrun run`, not by hand).
    #[command(hide = true)]
    Agent(AgentArgs),
    /// List, inspect, verify and export checkpoints.
    #[command(subcommand)]
    Ckpt(CkptCommand),
    /// The runs in a runs directory: name, state, attempts, step, last loss, duration.
    Ls {
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
    },
    /// One run: state, attempts and their failures, metrics, checkpoints, goodput.
    Status {
        name: String,
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
    },
    /// A rank's log (rank 0 unless --rank), every attempt or one.
    Logs {
        name: String,
        #[arg(long, default_value_t = 0, value_name = "R")]
        rank: u32,
        /// Only this attempt's part of the log.
        #[arg(long, value_name = "K")]
        attempt: Option<u32>,
        /// Keep printing what is appended until the run ends.
        #[arg(short, long)]
        follow: bool,
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
    },
    /// Write the run's report page (runs/NAME/report.html) and print its path.
    Report {
        name: String,
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
    },
    /// Ask a running run to stop: every worker saves a checkpoint at its
    /// next report and the run ends (as on SIGTERM); with --now, at once.
    /// Works from any shell on the controller's machine (the run's token
    /// authenticates the request). Waits until the run has ended.
    Stop {
        name: String,
        /// Stop every worker now, without a checkpoint.
        #[arg(long)]
        now: bool,
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
    },
    /// Trace the next K steps of a running run with jax.profiler, on every
    /// rank (or those of --ranks); the traces come over the network to the
    /// run's folder, profiles/<time>/rank-R/, and one TensorBoard view
    /// shows them all. Waits until they are there and prints where.
    Profile {
        name: String,
        /// How many steps to trace, from each rank's next report.
        #[arg(long, default_value_t = meshrun_plan::DEFAULT_PROFILE_STEPS, value_name = "K")]
        steps: u32,
        /// Only these ranks, comma-separated (default: every rank).
        #[arg(long, value_name = "R,...", value_delimiter = ',')]
        ranks: Option<Vec<u32>>,
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
    },
    /// Serve a live page of the runs in DIR: the list of runs, and each
    /// run's report, updating in the browser as the runs go on. Listens on
    /// 127.0.0.1 unless --host says otherwise; on any other address every
    /// request must carry the token printed with the address.
    Serve {
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
        host: std::net::IpAddr,
        /// The port to listen on (0: any free port).
        #[arg(long, default_value_t = 8070, value_name = "PORT")]
        port: u16,
    },
    /// Print a completion script for a shell (e.g. `meshrun completion bash >
    /// ~/.local/share/bash-completion/completions/meshrun`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The command line as completion scripts offer it. The generators of
/// `clap_complete` offer hidden subcommands too (`agent`), and a `clap::Command`
/// cannot drop one, so the root is rebuilt from the parser's own arguments
/// and visible subcommands: nothing is restated, so it cannot drift.
/// `-n`: a count of workers, 1 or more (clap's own parser would say
/// "not in 0..=4294967295" of -1, naming a 0 that is refused too).
fn parse_nprocs(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(n) if n < 1 => Err(format!("-n/--nprocs must be at least 1, got {n}")),
        Ok(n) => u32::try_from(n)
            .map_err(|_| format!("-n/--nprocs must be at most {}, got {n}", u32::MAX)),
        Err(e) => Err(e.to_string()),
    }
}

/// `meshrun run --nproc 2 train.py`: an option `run` does not know lands
/// in the program's words (everything from the script on is the
/// program's). A first word that looks like an option is refused as clap
/// refuses an unknown option, with the option it most likely meant.
pub fn misplaced_option(args: &RunArgs) -> Option<clap::Error> {
    let first = args.program.first()?;
    if !first.starts_with('-') || first == "-" {
        return None;
    }
    let mut run = <Cli as clap::CommandFactory>::command()
        .find_subcommand("run")?
        .clone()
        .bin_name("meshrun run");
    let word = first.split('=').next().unwrap_or(first);
    let known = run
        .get_arguments()
        .filter_map(clap::Arg::get_long)
        .map(|l| format!("--{l}"));
    let near = known
        .map(|l| (strsim::jaro(word, &l), l))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let tip = near.map_or_else(
        || "\n\n  tip: `meshrun run --help` lists the options".to_string(),
        |(_, l)| format!("\n\n  tip: a similar argument exists: '{l}'"),
    );
    Some(run.error(
        clap::error::ErrorKind::UnknownArgument,
        format!(
            "unexpected argument '{first}' found before the script{tip}\n  \
             tip: a script whose name starts with '-' is given as ./{first}"
        ),
    ))
}

pub fn completion_command() -> clap::Command {
    let full = <Cli as clap::CommandFactory>::command();
    clap::Command::new("meshrun")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
}

#[derive(Debug, Subcommand)]
pub enum CkptCommand {
    /// The committed checkpoints of a run: a run name, its folder, or the
    /// URL of its storage folder (s3://bucket/prefix/NAME).
    Ls {
        run: String,
        #[arg(long, default_value = "runs", value_name = "DIR")]
        runs_dir: PathBuf,
        /// The storage the run was given (--storage): look for RUN there.
        #[arg(long, value_name = "DIR|URL")]
        storage: Option<String>,
    },
    /// Step, metrics, and every leaf's shape, dtype and bytes (a step's
    /// folder or URL).
    Inspect { path: String },
    /// Check every CRC of every shard (a step's folder or URL).
    Verify { path: String },
    /// Write one plain safetensors file with every leaf whole.
    Export { path: String, out: PathBuf },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlatformArg {
    Cpu,
    Cuda,
    Auto,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ScoreOrderArg {
    Max,
    Min,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOffArg {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SaveErrorArg {
    Continue,
    Fail,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TeeArg {
    /// Rank 0's output only.
    Rank0,
    /// Every rank's output, each line prefixed [r].
    All,
    /// Nothing; output goes to the run's log files only.
    None,
}

// Switches on a command line are flags: one bool each.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Number of worker processes in all.
    #[arg(
        short = 'n',
        long = "nprocs",
        default_value_t = 1,
        value_name = "NPROCS",
        allow_negative_numbers = true,
        value_parser = parse_nprocs
    )]
    pub nprocs: u32,

    /// Number of hosts; with the local backend each is an agent process on
    /// its own loopback address (127.0.0.2, ...). Must divide NPROCS.
    /// MIN:MAX: an elastic run on at least MIN and at most MAX hosts
    /// (NPROCS counts MAX hosts' processes; each host keeps its share).
    #[arg(long, default_value = "1", value_name = "H|MIN:MAX", value_parser = parse_hosts)]
    pub hosts: HostsArg,

    /// Elastic runs: how long a restart waits for a lost host before it
    /// runs on the hosts present, in seconds [default: 60].
    #[arg(long, value_name = "S")]
    pub rejoin_timeout: Option<f64>,

    /// Elastic runs: run on any host count from MIN to MAX, not only the
    /// counts that divide MAX.
    #[arg(long)]
    pub any_host_count: bool,

    /// CPU devices per worker (sets --`xla_force_host_platform_device_count`).
    #[arg(long, value_name = "K")]
    pub devices_per_proc: Option<u32>,

    /// Memory each worker may use, such as 2GiB or 1500MiB: its host memory
    /// (a cgroup limit) on cpu, its GPU's memory on cuda. A worker past it
    /// is reported as out of memory, with what its state needs.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory_per_proc: Option<MemoryLimit>,

    /// GPUs per worker; each worker gets its own, never shared.
    #[arg(long, value_name = "G")]
    pub gpus_per_proc: Option<u32>,

    /// Accelerator platform; auto picks cuda when GPUs are present.
    #[arg(long, value_enum, default_value_t = PlatformArg::Auto)]
    pub platform: PlatformArg,

    /// Run name: the folder under the runs directory. Default: run-<time>-<id>.
    #[arg(long)]
    pub name: Option<String>,

    /// Where runs are kept.
    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Which ranks' output is shown on the terminal.
    #[arg(long, value_enum, default_value_t = TeeArg::Rank0)]
    pub tee: TeeArg,

    /// No live progress line (without a terminal, no periodic progress lines).
    #[arg(short, long)]
    pub quiet: bool,

    /// Keep at most this many committed checkpoints (the newest always stays).
    #[arg(long, value_name = "N")]
    pub keep_checkpoints: Option<usize>,

    /// Also keep every checkpoint whose step is a multiple of K.
    #[arg(long, value_name = "K")]
    pub keep_every_n_steps: Option<u64>,

    /// Rank checkpoints by this reported metric instead of recency.
    #[arg(long, value_name = "METRIC")]
    pub checkpoint_score: Option<String>,

    /// Whether a higher or lower --checkpoint-score is better.
    #[arg(long, value_enum, default_value_t = ScoreOrderArg::Max)]
    pub checkpoint_score_order: ScoreOrderArg,

    /// Save the state passed to `meshrun.report(checkpoint=...)` only at
    /// steps that are multiples of N (and when preempted).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,

    /// Also keep the state passed to `meshrun.report(checkpoint=...)` in
    /// host memory every N steps, with a replica on a buddy host: a
    /// restart resumes from it (losing at most N steps) before any durable
    /// checkpoint that is older.
    #[arg(long, value_name = "N")]
    pub memory_checkpoint_every: Option<u64>,

    /// Keep a warm standby interpreter per worker on each host, with JAX
    /// imported, to take over a restart [default: on with --max-failures].
    #[arg(long, value_enum, value_name = "SWITCH")]
    pub warm_spares: Option<OnOffArg>,

    /// What a warm spare imports before it waits, comma-separated
    /// [default: jax,jax.numpy,flax,optax, each where installed].
    #[arg(long, value_name = "MODULES", value_delimiter = ',')]
    pub spare_imports: Option<Vec<String>>,

    /// When a rank's shards of a checkpoint cannot be written (the storage
    /// is down or full): train on without that checkpoint (continue; the
    /// next save tries again) or fail the attempt (fail).
    #[arg(long, value_enum, default_value_t = SaveErrorArg::Continue)]
    pub on_save_error: SaveErrorArg,

    /// Write rank 0's metrics as tensorboard event files in the run's
    /// tensorboard/ folder (`tensorboard --logdir runs` shows every run).
    #[arg(long)]
    pub tensorboard: bool,

    /// The metric shown as the run's loss in the progress line, `ls`,
    /// `status` and the report (default: `loss`, else the first reported
    /// metric whose name ends in `loss`, such as `train_loss`).
    #[arg(long, value_name = "NAME")]
    pub loss_metric: Option<String>,

    /// For a program that never calls `meshrun.report` (MaxText, most
    /// programs not written for meshrun): a JSON-lines file it writes its
    /// metrics to, one object a step with its `step`, relative to the
    /// program's folder. Rank 0 follows it and reports each line as a step:
    /// the progress line, `status`, the report and --hang-timeout see them.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<String>,

    /// A rank that reaches its steps more than this share of a step later
    /// than the median rank (0.2: 20%), for --straggler-steps steps in a
    /// row, is named a straggler: an event, `status` and the report say so.
    #[arg(long, default_value_t = meshrun_plan::Observe::default().straggler_threshold, value_name = "SHARE")]
    pub straggler_threshold: f64,

    /// See --straggler-threshold.
    #[arg(long, default_value_t = meshrun_plan::Observe::default().straggler_steps, value_name = "N")]
    pub straggler_steps: u32,

    /// Take one profile capture of the ranks (jax.profiler, 3 steps) when a
    /// straggler is first named; it lands in the run's profiles/ folder.
    #[arg(long)]
    pub profile_stragglers: bool,

    /// Trace every rank with jax.profiler from its report of step A to
    /// that of step B; the traces land in the run's profiles/ folder.
    #[arg(long, value_name = "A:B", value_parser = parse_profile_steps)]
    pub profile_steps: Option<(u64, u64)>,

    /// Restart from the newest checkpoint after up to N failed attempts.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_failures: u32,

    /// Resume run --name from its checkpoint of this step rather than from
    /// the newest one that verifies; the newer ones are set aside (renamed
    /// superseded-step-N, not deleted). `none`: start from the beginning,
    /// every checkpoint set aside.
    #[arg(long, value_name = "STEP|none")]
    pub resume_from: Option<meshrun_plan::ResumeFrom>,

    /// Treat an attempt as hung when a rank has not called `meshrun.report`
    /// for S seconds (start-up and compilation included): dump every rank's
    /// stacks, stop, and restart if failures remain.
    #[arg(long, value_name = "S")]
    pub hang_timeout: Option<f64>,

    /// While a rank that finished its program waits for the others (JAX's
    /// shutdown barrier), treat a rank that has not called `meshrun.report`
    /// for S seconds since as hung [default: 60].
    #[arg(long, value_name = "S")]
    pub finish_timeout: Option<f64>,

    /// How long an attempt may wait for cluster resources before its first
    /// step: a Ray placement group, or Ray tasks of the workers (Ray Data)
    /// that the cluster cannot run yet. What is waiting shows on the status
    /// line; past the limit the attempt fails naming it [default: 600].
    #[arg(long, value_name = "S")]
    pub start_timeout: Option<f64>,

    /// Place the agents on a Ray cluster: `auto` or the head's HOST:PORT.
    /// One placement-group bundle per host (--hosts), holding the CPUs and
    /// GPUs of its workers.
    #[arg(long, value_name = "ADDRESS")]
    pub ray: Option<String>,

    /// Ray placement strategy for the hosts' bundles.
    #[arg(
        long,
        default_value = "PACK",
        value_name = "PACK|SPREAD|STRICT_PACK|STRICT_SPREAD"
    )]
    pub ray_strategy: String,

    /// The address the controller listens on (default 127.0.0.1; with
    /// --ray, every interface).
    #[arg(long, value_name = "IP")]
    pub control_host: Option<IpAddr>,

    /// The port the controller listens on (default: any free port), for
    /// clusters whose firewall opens only known ports.
    #[arg(long, value_name = "PORT")]
    pub control_port: Option<u16>,

    /// Where checkpoints go (STORAGE/NAME/checkpoints/): the one folder
    /// every host must reach at the same path (a shared filesystem), or an
    /// object store: s3://bucket/prefix (gs://, az:// too; credentials and
    /// endpoint from AWS_* variables or the AWS profile). Default: the runs
    /// directory.
    #[arg(long, value_name = "PATH|URL")]
    pub storage: Option<String>,

    /// Let hosts 1.. join by themselves (Slurm, SSH, Kubernetes, bare
    /// machines): listen for them at ADDR:PORT, run host 0 here, print the
    /// command the other hosts run (`meshrun join ADDR:PORT`) and wait.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,

    /// How long hosts may take to join, in seconds [default: 300 with
    /// --listen, else 60].
    #[arg(long, value_name = "S")]
    pub join_timeout: Option<f64>,

    /// Run PROGRAM as a module (like python -m) instead of a script path.
    #[arg(short = 'm', long = "module")]
    pub module: bool,

    /// The script (or, with -m, the module) and its arguments.
    #[arg(
        required = true,
        allow_hyphen_values = true,
        value_name = "SCRIPT|MODULE [ARGS]"
    )]
    pub program: Vec<String>,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// Where the run listens (its --listen); a host name is resolved, and
    /// resolved again until it resolves (a pod's name may come late).
    #[arg(value_name = "ADDR:PORT")]
    pub controller: String,
    /// A file holding the run's token (the run prints its path); else
    /// `MESHRUN_TOKEN`.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// This host's rank (1 to H-1); default: `SLURM_NODEID` under Slurm,
    /// else the next free rank in the order hosts join.
    #[arg(long, value_name = "R")]
    pub host_rank: Option<u32>,
    /// Give up when no controller takes this host for S seconds (at the
    /// start, and after each attempt or lost connection).
    #[arg(long, default_value_t = 300.0, value_name = "S")]
    pub join_timeout: f64,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The controller's address.
    #[arg(long)]
    pub controller: SocketAddr,
    /// This host's rank.
    #[arg(long)]
    pub host: u32,
    /// The address this host is known by.
    #[arg(long)]
    pub host_ip: IpAddr,
    /// The run token (taken from the environment only).
    #[arg(long, env = "MESHRUN_TOKEN", hide_env_values = true, hide = true)]
    pub token: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_offer_the_visible_commands_only() {
        let full = <Cli as clap::CommandFactory>::command();
        let visible: Vec<&str> = full
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(clap::Command::get_name)
            .collect();
        let offered = completion_command();
        let offered: Vec<&str> = offered
            .get_subcommands()
            .map(clap::Command::get_name)
            .collect();
        assert_eq!(offered, visible);
        assert!(!offered.contains(&"agent") && offered.contains(&"completion"));
    }
}

/// `--hosts H` or `--hosts MIN:MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostsArg {
    pub min: Option<u32>,
    pub max: u32,
}

fn parse_hosts(text: &str) -> Result<HostsArg, String> {
    let number = |t: &str| t.trim().parse::<u32>().ok();
    let parsed = match text.split_once(':') {
        None => number(text).map(|max| HostsArg { min: None, max }),
        Some((min, max)) => number(min).zip(number(max)).map(|(min, max)| HostsArg {
            min: Some(min),
            max,
        }),
    };
    parsed.ok_or_else(|| {
        format!("expected a host count H or a range MIN:MAX (like 4 or 2:4), got '{text}'")
    })
}

fn parse_profile_steps(text: &str) -> Result<(u64, u64), String> {
    meshrun_plan::parse_profile_steps(text).map_err(|e| e.to_string())
}

fn parse_memory(text: &str) -> Result<MemoryLimit, String> {
    MemoryLimit::parse(text).map_err(|e| e.to_string())
}
