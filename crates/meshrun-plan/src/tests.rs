//! Tests of the run plan's validation.

use std::path::Path;

use super::*;
use crate::gpu::Inventory;

pub(crate) fn spec(dir: &Path) -> RunSpec {
    let script = dir.join("train.py");
    std::fs::write(&script, "print('hi')\n").unwrap();
    RunSpec {
        nprocs: 2,
        hosts: 1,
        devices_per_proc: None,
        gpus_per_proc: None,
        cpus_per_proc: None,
        memory_per_proc: None,
        platform: PlatformChoice::Cpu,
        name: Some("t".into()),
        runs_dir: dir.join("runs"),
        tee: Tee::Rank0,
        entry: Some(Entry::Script {
            path: script,
            args: vec![],
        }),
        python: "python3".into(),
        agent_command: vec![],
        env: vec![],
        retention: None,
        checkpoint_every: None,
        recovery: crate::Recovery::default(),
        on_save_error: crate::SaveErrorPolicy::Continue,
        tensorboard: false,
        loss_metric: None,
        metrics_file: None,
        failure: FailurePolicy::default(),
        ray: None,
        control_host: None,
        control_port: None,
        resume_from: None,
        storage: None,
        listen: None,
        join_timeout_s: None,
        elastic: None,
        observe: crate::Observe::default(),
    }
}

pub(crate) fn no_gpus() -> Result<Inventory, crate::gpu::GpuError> {
    Inventory::from_visible_devices("")
}

fn check(s: RunSpec) -> Result<RunPlan, UsageError> {
    s.validate_with(&no_gpus)
}

#[test]
fn valid_spec_plans_without_touching_disk() {
    let dir = tempfile::tempdir().unwrap();
    let plan = check(spec(dir.path())).unwrap();
    assert_eq!(plan.procs_per_host, 2);
    assert_eq!(plan.platform, Platform::Cpu);
    assert!(!dir.path().join("runs").exists());
}

#[test]
fn hosts_that_join_are_not_bound_by_the_loopback_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    (s.nprocs, s.hosts) = (1024, 512);
    let msg = check(s.clone()).unwrap_err().to_string();
    assert!(
        msg.contains("more than the local backend supports (250)"),
        "{msg}"
    );
    s.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let plan = check(s).unwrap();
    assert_eq!((plan.hosts, plan.procs_per_host), (512, 2));
}

#[test]
fn bad_counts_are_refused_with_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    s.nprocs = 0;
    assert!(check(s).unwrap_err().to_string().contains("got 0"));
    let mut s = spec(dir.path());
    s.hosts = 3;
    let msg = check(s).unwrap_err().to_string();
    assert!(msg.contains("--hosts 3 does not divide -n 2"), "{msg}");
    assert!(msg.contains("1, 2"), "{msg}");
    let mut s = spec(dir.path());
    s.devices_per_proc = Some(0);
    assert!(check(s)
        .unwrap_err()
        .to_string()
        .contains("--devices-per-proc"));
}

#[test]
fn run_names_are_checked() {
    let too_long = "a".repeat(101);
    for bad in [
        "a/b", "..", ".hidden", "", "x y", "../up", "-x", "--name", "x..", "a..b", "é", &too_long,
    ] {
        let err = check_run_name(bad).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("run name '{bad}' is not accepted")),
            "{err}"
        );
    }
    let longest = "a".repeat(100);
    for good in ["gpt-1", "run_2.b", "A", "x-", "v1.2.3", "_a", &longest] {
        assert!(check_run_name(good).is_ok(), "{good}");
    }
}

#[test]
fn gpu_requests_need_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    s.platform = PlatformChoice::Auto;
    s.gpus_per_proc = Some(1);
    let msg = check(s).unwrap_err().to_string();
    assert!(msg.contains("need 2 GPUs"), "{msg}");
    let mut s = spec(dir.path());
    s.gpus_per_proc = Some(1);
    assert!(matches!(check(s), Err(UsageError::GpusOnCpu(1))));
    let mut s = spec(dir.path());
    s.platform = PlatformChoice::Auto;
    s.gpus_per_proc = Some(2);
    let plan = s
        .validate_with(&|| Inventory::from_visible_devices("0,1,2,3"))
        .unwrap();
    assert_eq!(plan.platform, Platform::Cuda);
    assert_eq!(plan.gpus_per_proc, 2);
}

#[test]
fn auto_without_gpus_is_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    s.platform = PlatformChoice::Auto;
    assert_eq!(check(s).unwrap().platform, Platform::Cpu);
}

#[test]
fn runs_dir_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let mut s = spec(dir.path());
    s.runs_dir = file.clone();
    assert!(check(s)
        .unwrap_err()
        .to_string()
        .contains("not a directory"));
    let mut s = spec(dir.path());
    s.runs_dir = file.join("runs");
    assert!(check(s)
        .unwrap_err()
        .to_string()
        .contains("is not a directory"));
}

#[test]
fn missing_script_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    s.entry = Some(Entry::Script {
        path: "nope.py".into(),
        args: vec![],
    });
    assert!(check(s)
        .unwrap_err()
        .to_string()
        .contains("'nope.py' not found"));
}
