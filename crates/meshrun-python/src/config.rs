//! `Trainer`'s configuration objects (`ScalingConfig`, `RunConfig`,
//! `CheckpointConfig`, `FailureConfig`) read into the engine's [`RunSpec`].
//!
//! Only the types are checked here (an integer, a number, a known name),
//! each error naming the Python attribute and the value seen; whether the
//! values make a run is the plan's to decide ([`RunSpec::validate`]), and
//! its errors are worded for Python by [`crate::usage`].

use std::net::IpAddr;
use std::path::PathBuf;

use meshrun_plan::memory_limit::MemoryLimit;
use meshrun_plan::{choices, Elastic, Observe, Retention};
use meshrun_plan::{Entry, FailurePolicy, PlatformChoice, RayTarget, RunSpec};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use crate::errors::ConfigError;
use crate::usage::{at_least, no_ray_address};

/// Where the run folder goes when `RunConfig.storage_path` is a URL.
const LOCAL_RUNS: &str = choices::DEFAULT_RUNS_DIR;

/// The four configuration objects of a `Trainer`.
pub struct Configs<'py> {
    pub scaling: Bound<'py, PyAny>,
    pub run: Bound<'py, PyAny>,
    pub checkpoint: Bound<'py, PyAny>,
    pub failure: Bound<'py, PyAny>,
}

/// One configuration object, read attribute by attribute.
struct Config<'py> {
    obj: Bound<'py, PyAny>,
    class: &'static str,
}

impl<'py> Config<'py> {
    /// The attribute `field`; None when it is set to `None`.
    fn get(&self, field: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let value = self.obj.getattr(field)?;
        Ok((!value.is_none()).then_some(value))
    }

    fn wrong(&self, field: &str, value: Option<&Bound<'py, PyAny>>, what: &str) -> PyErr {
        let seen = value.map_or_else(
            || "None".to_string(),
            |v| v.repr().map_or_else(|_| "?".into(), |r| r.to_string()),
        );
        ConfigError::new_err(format!("{}.{field} must be {what}, got {seen}", self.class))
    }

    /// An unsigned integer of type `T`, or None; Python's `bool` is not one.
    fn uint<T: TryFrom<u64> + Bounded>(&self, field: &str) -> PyResult<Option<T>> {
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
            return Err(self.wrong(field, Some(&value), "an integer"));
        }
        let name = format!("{}.{field}", self.class);
        let n: i128 = value
            .extract()
            .map_err(|_| at_most(&name, T::MAX, &value))?;
        if n < 0 {
            return Err(ConfigError::new_err(at_least(&name, 0, n)));
        }
        u64::try_from(n)
            .ok()
            .and_then(|n| T::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| at_most(&name, T::MAX, n))
    }

    fn required_uint<T: TryFrom<u64> + Bounded>(&self, field: &str) -> PyResult<T> {
        self.uint(field)?
            .ok_or_else(|| self.wrong(field, None, "an integer"))
    }

    /// A number of seconds (an int or a float, not a bool), or None.
    fn seconds(&self, field: &str) -> PyResult<Option<f64>> {
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        let number = !value.is_instance_of::<PyBool>()
            && (value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>());
        if !number {
            return Err(self.wrong(field, Some(&value), "a number of seconds"));
        }
        value.extract().map(Some)
    }

    /// A memory size: bytes as an int, or text such as `"2GiB"`; None.
    fn size(&self, field: &str) -> PyResult<Option<MemoryLimit>> {
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        let read = if value.is_instance_of::<PyBool>() {
            None
        } else if let Ok(n) = value.extract::<u64>() {
            Some(MemoryLimit::from_bytes(n, &n.to_string()))
        } else if let Ok(text) = value.extract::<String>() {
            Some(MemoryLimit::parse(&text))
        } else {
            None
        };
        match read {
            Some(Ok(limit)) => Ok(Some(limit)),
            Some(Err(e)) => Err(ConfigError::new_err(format!("{}.{field}: {e}", self.class))),
            None => Err(self.wrong(
                field,
                Some(&value),
                "a number of bytes or a size such as \"2GiB\"",
            )),
        }
    }

    /// A string, or None.
    /// `RunConfig.resume_from`: a step, or "none" for the beginning.
    fn resume_from(&self) -> PyResult<Option<meshrun_plan::ResumeFrom>> {
        let field = "resume_from";
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        if let Ok(text) = value.extract::<String>() {
            if text.eq_ignore_ascii_case("none") {
                return Ok(Some(meshrun_plan::ResumeFrom::Beginning));
            }
            return Err(self.wrong(
                field,
                Some(&value),
                "a committed step (an integer) or \"none\" to start from the beginning",
            ));
        }
        if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
            return Err(self.wrong(
                field,
                Some(&value),
                "a committed step (an integer) or \"none\" to start from the beginning",
            ));
        }
        Ok(self.uint::<u64>(field)?.map(meshrun_plan::ResumeFrom::Step))
    }

    fn text(&self, field: &str) -> PyResult<Option<String>> {
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        value
            .extract()
            .map(Some)
            .map_err(|_| self.wrong(field, Some(&value), "a string"))
    }

    fn required_text(&self, field: &str) -> PyResult<String> {
        self.text(field)?
            .ok_or_else(|| self.wrong(field, None, "a string"))
    }

    /// One of the names in `accepted` (`aliases` are accepted too, unsaid).
    fn choice<T: Copy>(
        &self,
        field: &str,
        accepted: &[(&str, T)],
        aliases: &[(&str, T)],
    ) -> PyResult<T> {
        let value = self.get(field)?;
        let text: Option<String> = value.as_ref().and_then(|v| v.extract().ok());
        accepted
            .iter()
            .chain(aliases)
            .find(|(name, _)| text.as_deref() == Some(*name))
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<String> = accepted.iter().map(|(n, _)| format!("'{n}'")).collect();
                let listed = match names.split_last() {
                    Some((last, [])) => last.clone(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                };
                self.wrong(field, value.as_ref(), &listed)
            })
    }

    /// A list of strings, or None.
    fn strings(&self, field: &str) -> PyResult<Option<Vec<String>>> {
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        if value.is_instance_of::<pyo3::types::PyString>() {
            return Err(self.wrong(field, Some(&value), "a list of strings"));
        }
        value
            .extract()
            .map(Some)
            .map_err(|_| self.wrong(field, Some(&value), "a list of strings"))
    }

    /// True, False, or None.
    fn flag(&self, field: &str) -> PyResult<Option<bool>> {
        let Some(value) = self.get(field)? else {
            return Ok(None);
        };
        if !value.is_instance_of::<PyBool>() {
            return Err(self.wrong(field, Some(&value), "True, False or None"));
        }
        value.extract().map(Some)
    }

    fn truthy(&self, field: &str) -> PyResult<bool> {
        self.obj.getattr(field)?.is_truthy()
    }
}

/// The largest value of an unsigned integer type, for messages.
trait Bounded {
    const MAX: u64;
}
impl Bounded for u16 {
    const MAX: u64 = u16::MAX as u64;
}
impl Bounded for u32 {
    const MAX: u64 = u32::MAX as u64;
}
impl Bounded for u64 {
    const MAX: u64 = u64::MAX;
}
impl Bounded for usize {
    const MAX: u64 = usize::MAX as u64;
}

fn at_most(name: &str, max: u64, got: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(format!("{name} must be at most {max}, got {got}"))
}

/// Whether `RunConfig.progress` asks for the live progress line.
pub fn progress(run: &Bound<'_, PyAny>) -> PyResult<bool> {
    run.getattr("progress")?.is_truthy()
}

/// What `Trainer.fit()` runs. Nothing is validated beyond the types here.
pub fn run_spec(
    configs: &Configs<'_>,
    env: Vec<(String, String)>,
    python: PathBuf,
    agent_command: Vec<String>,
) -> PyResult<RunSpec> {
    let s = Config {
        obj: configs.scaling.clone(),
        class: "ScalingConfig",
    };
    let r = Config {
        obj: configs.run.clone(),
        class: "RunConfig",
    };
    let ckpt = Config {
        obj: configs.checkpoint.clone(),
        class: "CheckpointConfig",
    };
    let failure = Config {
        obj: configs.failure.clone(),
        class: "FailureConfig",
    };

    let gpus_per_proc = s.uint::<u32>("gpus_per_worker")?;
    let platform = if s.get("platform")?.is_some() {
        s.choice(
            "platform",
            &[
                ("cpu", PlatformChoice::Cpu),
                ("cuda", PlatformChoice::Cuda),
                ("auto", PlatformChoice::Auto),
            ],
            &[("gpu", PlatformChoice::Cuda)],
        )?
    } else if s.truthy("use_gpu")? || gpus_per_proc.is_some_and(|n| n > 0) {
        // Without a platform, asking for GPUs means cuda.
        PlatformChoice::Cuda
    } else {
        PlatformChoice::Cpu
    };
    let ray = if s.choice("backend", &[("local", false), ("ray", true)], &[])? {
        let address = s
            .text("ray_address")?
            .ok_or_else(|| ConfigError::new_err(no_ray_address()))?;
        Some(RayTarget {
            address,
            strategy: s.required_text("ray_strategy")?.to_uppercase(),
        })
    } else {
        None
    };
    let control_host = s
        .text("control_host")?
        .map(|h| {
            h.parse::<IpAddr>().map_err(|_| {
                ConfigError::new_err(format!(
                    "ScalingConfig.control_host must be an IP address (like '127.0.0.1' or \
                     '0.0.0.0'), got '{h}'"
                ))
            })
        })
        .transpose()?;
    let listen = s
        .text("listen")?
        .map(|a| {
            a.parse::<std::net::SocketAddr>().map_err(|_| {
                ConfigError::new_err(format!(
                    "ScalingConfig.listen must be ADDRESS:PORT where the other hosts reach this \
                     one (like '10.0.0.1:29400'), got '{a}'"
                ))
            })
        })
        .transpose()?;
    // Checked even when nothing is pruned: a typo should not wait for the
    // day retention is switched on.
    let score_order = ckpt.choice("score_order", &choices::SCORE_ORDERS, &[])?;
    let score_attribute = ckpt.text("score_attribute")?;
    let num_to_keep = ckpt.uint::<usize>("num_to_keep")?;
    let keep_every_n_steps = ckpt.uint::<u64>("keep_every_n_steps")?;
    let retention = (num_to_keep.is_some() || keep_every_n_steps.is_some()).then_some(Retention {
        num_to_keep,
        keep_every_n_steps,
        score_attribute,
        score_order,
    });
    let storage_path: String = match r.get("storage_path")? {
        Some(path) => path
            .str()
            .map(|s| s.to_string())
            .or_else(|_| path.call_method0("__fspath__").and_then(|p| p.extract()))
            .map_err(|_| {
                r.wrong(
                    "storage_path",
                    Some(&path),
                    "a path or a URL such as s3://bucket/prefix",
                )
            })?,
        None => {
            return Err(r.wrong(
                "storage_path",
                None,
                "a path or a URL such as s3://bucket/prefix",
            ))
        }
    };
    let remote = meshrun_ckpt::store::is_url(&storage_path);
    let (nprocs, hosts, elastic) = workers(&s)?;
    Ok(RunSpec {
        nprocs,
        hosts,
        devices_per_proc: s.uint("devices_per_worker")?,
        gpus_per_proc,
        cpus_per_proc: s
            .get("cpus_per_worker")?
            .map(|v| v.extract::<f64>())
            .transpose()?,
        memory_per_proc: s.size("memory_per_worker")?,
        platform,
        name: r.text("name")?,
        runs_dir: if remote {
            PathBuf::from(LOCAL_RUNS)
        } else {
            PathBuf::from(&storage_path)
        },
        tee: r.choice("tee", &choices::TEES, &[])?,
        entry: Some(Entry::Function),
        python,
        agent_command,
        env,
        retention,
        checkpoint_every: ckpt.uint("every_n_steps")?,
        recovery: meshrun_plan::Recovery {
            memory_every: ckpt.uint("memory_every_n_steps")?,
            warm_spares: failure.flag("warm_spares")?,
            spare_imports: failure.strings("spare_imports")?,
        },
        on_save_error: ckpt.choice("on_save_error", &choices::SAVE_ERROR_POLICIES, &[])?,
        tensorboard: r.truthy("tensorboard")?,
        loss_metric: r.text("loss_metric")?,
        metrics_file: r.text("metrics_file")?,
        failure: FailurePolicy {
            max_failures: failure.required_uint("max_failures")?,
            hang_timeout_s: failure.seconds("hang_timeout_s")?,
            finish_timeout_s: None,
            start_timeout_s: failure.seconds("start_timeout_s")?,
        },
        ray,
        control_host,
        control_port: s.uint("control_port")?,
        resume_from: r.resume_from()?,
        // A path in `storage_path` holds the run folders and the checkpoints
        // alike, as in Ray Train: the one path every host must reach. A URL
        // holds the checkpoints; the run folder (logs, metrics, report)
        // stays on this machine, under `runs/`.
        storage: remote.then_some(storage_path),
        listen,
        join_timeout_s: s.seconds("join_timeout_s")?,
        elastic,
        observe: observe(&r)?,
    })
}

/// `RunConfig`'s straggler and profile fields.
fn observe(r: &Config<'_>) -> PyResult<Observe> {
    let defaults = Observe::default();
    let profile_steps = match r.get("profile_steps")? {
        None => None,
        Some(v) => Some(
            v.extract::<(u64, u64)>()
                .ok()
                .filter(|(a, b)| a < b)
                .ok_or_else(|| {
                    r.wrong(
                        "profile_steps",
                        Some(&v),
                        "a pair (A, B) of steps with A below B",
                    )
                })?,
        ),
    };
    Ok(Observe {
        straggler_threshold: match r.get("straggler_threshold")? {
            None => defaults.straggler_threshold,
            Some(v) => v
                .extract::<f64>()
                .ok()
                .filter(|t| !v.is_instance_of::<PyBool>() && t.is_finite() && *t > 0.0)
                .ok_or_else(|| {
                    r.wrong(
                        "straggler_threshold",
                        Some(&v),
                        "a share of a step above 0 (0.2: 20%)",
                    )
                })?,
        },
        straggler_steps: r
            .uint("straggler_steps")?
            .unwrap_or(defaults.straggler_steps),
        profile_stragglers: r.truthy("profile_stragglers")?,
        profile_steps,
    })
}

/// `ScalingConfig.num_workers`: a count, or `(MIN, MAX)` for an elastic
/// run (as Ray Train's v2 spells it). The run grows and shrinks by whole
/// hosts: without `num_hosts` each worker is a host of its own; with it,
/// MAX workers spread over `num_hosts` hosts and MIN must be a whole number
/// of hosts' workers. Returns (processes, hosts, elasticity), at MAX.
fn workers(s: &Config<'_>) -> PyResult<(u32, u32, Option<Elastic>)> {
    let rejoin_timeout_s = s.seconds("rejoin_timeout_s")?;
    let any_count = s.flag("any_host_count")?.unwrap_or(false);
    let value = s.get("num_workers")?;
    let range: Option<(u32, u32)> = value.as_ref().and_then(|v| {
        let pair =
            v.is_instance_of::<pyo3::types::PyTuple>() || v.is_instance_of::<pyo3::types::PyList>();
        pair.then(|| v.extract::<(u32, u32)>().ok()).flatten()
    });
    let Some((min, max)) = range else {
        if value.as_ref().is_some_and(|v| !v.is_instance_of::<PyInt>()) {
            return Err(s.wrong(
                "num_workers",
                value.as_ref(),
                "an integer, or a pair (MIN, MAX) for an elastic run",
            ));
        }
        if rejoin_timeout_s.is_some() || any_count {
            return Err(ConfigError::new_err(crate::usage::python_words(
                &meshrun_plan::UsageError::ElasticOptionsWithoutRange,
            )));
        }
        return Ok((
            s.required_uint("num_workers")?,
            s.required_uint("num_hosts")?,
            None,
        ));
    };
    let hosts: u32 = s.required_uint("num_hosts")?;
    let hosts = if hosts <= 1 { max } else { hosts };
    let per_host = if hosts > 0 && max % hosts == 0 {
        max / hosts
    } else {
        1
    };
    if min > max || min == 0 || min % per_host != 0 {
        return Err(ConfigError::new_err(format!(
            "ScalingConfig.num_workers=({min}, {max}) with {hosts} host(s) at most: MIN must \
             be at least one host's {per_host} worker(s), at most MAX, and a multiple of \
             {per_host} (the run grows and shrinks by whole hosts)"
        )));
    }
    Ok((
        max,
        hosts,
        Some(Elastic {
            min_hosts: min / per_host,
            rejoin_timeout_s,
            any_count,
        }),
    ))
}

/// Bytes from a size such as `"2GiB"`, read as `--memory-per-proc` reads
/// it (no lower bound): `meshrun.planning`'s sizes.
#[pyfunction]
pub fn parse_size(text: &str) -> PyResult<u64> {
    meshrun_plan::memory_limit::parse_bytes(text).map_err(|e| ConfigError::new_err(e.to_string()))
}
