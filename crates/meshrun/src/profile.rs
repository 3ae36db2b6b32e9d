//! `meshrun profile NAME [--steps K] [--ranks R,...]`: a profile capture
//! of a running run, from the next report of each rank; waits until the
//! traces are in the run folder and says how to open them.

use std::path::Path;

use meshrun_core::controller::remote::profile_run;

use crate::commands::error;
use crate::{exit, runs};

pub fn profile(name: &str, runs_dir: &Path, steps: u32, ranks: Option<Vec<u32>>) -> i32 {
    let run = match runs::find(name, runs_dir) {
        Ok(run) => run,
        Err(e) => {
            error(&e);
            return e.exit_code();
        }
    };
    let accepted = |dir: &str, ranks: &[u32]| {
        runs::out(&format!(
            "meshrun: run '{name}': tracing {steps} step(s) of {} from their next report into {dir}\n",
            ranks_text(ranks)
        ));
    };
    match profile_run(&run.dir, name, ranks, steps, accepted) {
        Ok(done) => {
            for (rank, why) in &done.missing {
                error(format!("rank {rank} sent no trace: {why}"));
            }
            if done.ranks.is_empty() {
                return exit::FAILURE;
            }
            let tb = Path::new(&done.dir).join(meshrun_record::names::PROFILE_TENSORBOARD);
            runs::out(&format!(
                "meshrun: traces of {} saved in {}\n\
                 open them in one view: tensorboard --logdir {} --host 127.0.0.1 \
                 (needs the tensorboard-plugin-profile package; its trace viewer takes several hosts, one per rank), \
                 or each rank's rank-R/**/*.trace.json.gz in Perfetto\n",
                ranks_text(&done.ranks),
                done.dir,
                tb.display()
            ));
            if done.missing.is_empty() {
                exit::SUCCESS
            } else {
                exit::FAILURE
            }
        }
        Err(e) => {
            error(&e);
            e.exit_code()
        }
    }
}

fn ranks_text(ranks: &[u32]) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}
