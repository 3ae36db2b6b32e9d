//! Before anything starts, on this machine's backend: that the program can
//! be loaded at all. A script that does not compile, or a module that is
//! not there, fails every worker of every attempt the same way, after the
//! launch; said here, it is a usage error and nothing is started.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::{Entry, UsageError};

/// Compiles a script, or looks a module's top-level package up, with the
/// workers' interpreter, folder and environment; prints why it cannot be
/// loaded and exits 3 when it cannot. Nothing of the program runs: a
/// module's package is found, not imported.
const CHECK: &str = r#"
import importlib.util, sys
kind, target = sys.argv[1], sys.argv[2]
if kind == "script":
    try:
        with open(target, "rb") as f:
            compile(f.read(), target, "exec")
    except SyntaxError as e:
        print(f"{type(e).__name__}: {e.msg} ({e.filename}, line {e.lineno})")
        sys.exit(3)
else:
    sys.path.insert(0, "")
    top = target.split(".")[0]
    if importlib.util.find_spec(top) is None:
        print(f"no module named '{top}'")
        sys.exit(3)
"#;

/// Checks `entry` with `python` in `cwd` under `env`. An interpreter that
/// cannot be run says nothing here: the launch names that itself.
pub(crate) fn check_loadable(
    python: &Path,
    entry: &Entry,
    cwd: &Path,
    env: &[(String, String)],
) -> Result<(), UsageError> {
    let (kind, target) = match entry {
        Entry::Script { path, .. } => ("script", path.display().to_string()),
        Entry::Module { name, .. } => ("module", name.clone()),
        Entry::Function => return Ok(()),
    };
    let Ok(out) = Command::new(python)
        .args(["-c", CHECK, kind, &target])
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return Ok(());
    };
    if out.status.code() != Some(3) {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Err(match entry {
        Entry::Module { name, .. } => UsageError::ModuleNotFound {
            name: name.clone(),
            why,
            python: python.to_path_buf(),
            cwd: cwd.to_path_buf(),
        },
        _ => UsageError::ScriptDoesNotCompile {
            path: target.into(),
            why,
        },
    })
}
