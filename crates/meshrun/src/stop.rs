//! `meshrun stop NAME [--now]`: asks a live run to stop, then waits until
//! its controller has let go of it and says how it ended.

use std::path::Path;
use std::time::{Duration, Instant};

use meshrun_core::controller::remote::stop_run;
use meshrun_record::read::lock_is_held;

use crate::commands::error;
use crate::{exit, runs};

/// A preempted run may take its 60 s for a checkpoint, then stops.
const END_WAIT: Duration = Duration::from_mins(2);

pub fn stop(name: &str, runs_dir: &Path, now: bool) -> i32 {
    let run = match runs::find(name, runs_dir) {
        Ok(run) => run,
        Err(e) => {
            error(&e);
            return e.exit_code();
        }
    };
    let answer = match stop_run(&run.dir, name, now) {
        Ok(answer) => answer,
        Err(e) => {
            error(&e);
            return e.exit_code();
        }
    };
    runs::out(&format!("meshrun: run '{name}': {answer}\n"));
    let deadline = Instant::now() + END_WAIT;
    while lock_is_held(&run.dir) {
        if Instant::now() >= deadline {
            error(format!(
                "run '{name}' is still stopping after {} s; see meshrun status {name}",
                END_WAIT.as_secs()
            ));
            return exit::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = runs::find(name, runs_dir).map_or_else(|_| "unknown".to_string(), |r| r.state);
    runs::out(&format!("meshrun: run '{name}' ended: {state}\n"));
    exit::SUCCESS
}
