//! `meshrun join ADDR:PORT`: a host that joins a run by itself (Slurm,
//! SSH, Kubernetes, bare machines), in the shape of torchrun's
//! rendezvous. It takes part in every attempt of the run: after an
//! attempt, or when its connection breaks (the controller restarting, the
//! network cut), it joins again, retrying with backoff until the join
//! timeout, and keeps the host rank it was given.

use std::time::{Duration, Instant};

use super::{run, AgentConfig, Ended};
use crate::error::AgentError;

/// The first retry comes this soon; each next one waits twice as long, up
/// to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A handshake cut short in a row this many times means the controller
/// does not take this host's token. From this side a wrong token looks like
/// a closed connection, and so does the previous attempt's listener going
/// away under a host that rejoins at once: one cut is not a refusal.
const HANDSHAKE_TRIES: u32 = 3;

/// Joins attempt after attempt until the run is over. `timeout` bounds
/// each wait for a controller to join. Gives how the run ended (a
/// `RunState` name), when the controller said.
pub async fn join(mut cfg: AgentConfig, timeout: Duration) -> Result<Option<String>, AgentError> {
    let mut waiting_since = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let mut cut_short = 0;
    loop {
        let result = run(&cfg).await;
        if matches!(result, Err(AgentError::HandshakeFailed { .. })) {
            cut_short += 1;
        } else {
            cut_short = 0;
        }
        match result {
            Ok((ended, host)) => {
                // Later attempts keep the rank this host was given.
                cfg.host = host.or(cfg.host);
                cfg.rejoining |= host.is_some();
                match ended {
                    Ended::Over(state) => return Ok(state),
                    Ended::Again | Ended::Lost => {
                        tracing::debug!(host = ?cfg.host, ?ended, "joining the next attempt");
                        waiting_since = Instant::now();
                        backoff = FIRST_BACKOFF;
                        continue;
                    }
                }
            }
            // Refusals are final: trying again cannot change them.
            Err(e @ AgentError::JoinRefused(_)) => return Err(e),
            Err(e @ AgentError::HandshakeFailed { .. }) if cut_short >= HANDSHAKE_TRIES => {
                return Err(e);
            }
            Err(e) if waiting_since.elapsed() >= timeout => {
                return Err(AgentError::JoinTimeout {
                    controller: cfg.controller,
                    secs: timeout.as_secs(),
                    last: e.to_string(),
                });
            }
            Err(e) => tracing::debug!("cannot join yet: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
