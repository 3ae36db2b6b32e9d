//! What each worker is started with: its command line (always through
//! meshrun's Python bootstrap, which joins the run before the user's code
//! starts) and its environment (the contract in `worker_env`).

use meshrun_protocol::WorkerLaunch;

use crate::gpu::{GpuError, Inventory, InventorySource};
use crate::worker_env::{worker_env, AttemptInfo, Placement};
use crate::{Entry, Platform, RunPlan};

/// The worker's command line: the bootstrap module, then what to run.
pub fn worker_argv(plan: &RunPlan) -> Vec<String> {
    let mut argv = vec![
        plan.python.display().to_string(),
        "-m".into(),
        "meshrun._bootstrap".into(),
    ];
    match &plan.entry {
        Entry::Script { path, args } => {
            argv.push("script".into());
            argv.push(path.display().to_string());
            argv.extend(args.iter().cloned());
        }
        Entry::Module { name, args } => {
            argv.push("module".into());
            argv.push(name.clone());
            argv.extend(args.iter().cloned());
        }
        // The agent writes the function it was sent into the run's scratch
        // folder on its host: the bootstrap finds it there by this name.
        Entry::Function => {
            argv.push("function".into());
            argv.push(meshrun_record::names::FUNCTION.into());
        }
    }
    argv
}

/// The launches of one host's workers.
pub fn host_launches(
    plan: &RunPlan,
    info: &AttemptInfo<'_>,
    host: u32,
    host_gpus: &[String],
) -> Result<Vec<WorkerLaunch>, GpuError> {
    let gpus = match plan.platform {
        Platform::Cuda => Inventory {
            ids: host_gpus.to_vec(),
            source: InventorySource::Detected,
        }
        .assign(host, plan.procs_per_host, plan.gpus_per_proc)?,
        Platform::Cpu => vec![Vec::new(); plan.procs_per_host as usize],
    };
    let argv = worker_argv(plan);
    Ok((0..plan.procs_per_host)
        .map(|local| {
            let rank = host * plan.procs_per_host + local;
            WorkerLaunch {
                rank,
                argv: argv.clone(),
                env: worker_env(plan, info, Placement::of(plan, rank), &gpus[local as usize]),
                cwd: plan.cwd.display().to_string(),
            }
        })
        .collect())
}

#[cfg(all(test, feature = "validate"))]
mod tests {
    use super::*;

    #[test]
    fn an_agent_finds_the_script_in_the_command_line_built_here() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = crate::tests::spec(dir.path())
            .validate_with(&crate::tests::no_gpus)
            .unwrap();
        let launch = |plan: &RunPlan| WorkerLaunch {
            rank: 0,
            argv: worker_argv(plan),
            env: Vec::new(),
            cwd: ".".into(),
        };
        assert_eq!(
            launch(&plan).script(),
            Some(dir.path().join("train.py").to_str().unwrap())
        );
        plan.entry = Entry::Module {
            name: "pkg.train".into(),
            args: vec![],
        };
        assert_eq!(launch(&plan).script(), None);
    }
}
