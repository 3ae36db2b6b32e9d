//! Stopping a host's workers on the controller's word.

use std::time::Duration;

use meshrun_protocol::{FromAgent, STACK_DUMP_WAIT};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::process::{catches, signal_group, signal_process};
use crate::scratch;

/// SIGTERM to every group, SIGKILL after the grace: JAX workers catch
/// SIGTERM (preemption notifier) and may never act on it. With stacks to
/// collect, SIGUSR1 to each worker process first (not its group: only
/// meshrun's worker code handles it), a moment to write, and what each
/// wrote goes to the controller before any exit is reported.
pub(crate) fn stop(
    pids: Vec<(u32, u32)>,
    grace: Duration,
    stacks: Option<scratch::StacksReader>,
    events: mpsc::UnboundedSender<FromAgent>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Some(stacks) = &stacks {
            for &(_, pid) in &pids {
                // Not to one without meshrun's handler yet: it would die
                // of the signal, a death meshrun would then have caused.
                if catches(pid, Signal::SIGUSR1) {
                    signal_process(pid, Signal::SIGUSR1);
                }
            }
            tokio::time::sleep(STACK_DUMP_WAIT).await;
            for &(rank, _) in &pids {
                if let Some(text) = stacks.read(rank) {
                    let _ = events.send(FromAgent::Stacks { rank, text });
                }
            }
        }
        for &(_, pid) in &pids {
            signal_group(pid, Signal::SIGTERM);
        }
        tokio::time::sleep(grace).await;
        for (_, pid) in pids {
            signal_group(pid, Signal::SIGKILL);
        }
    })
}
