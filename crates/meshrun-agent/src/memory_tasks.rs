//! The memory tier's two jobs that a session starts and leaves running:
//! committing this host's part of a memory checkpoint (and its replica and
//! executables to the buddy), and making one whole again before a restart.
//! Each answers the controller through the session's event queue.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meshrun_protocol::token::Token;
use meshrun_protocol::FromAgent;
use tokio::sync::mpsc;

use crate::{executables, memory};

/// The folder of a run's travelling executables in the host's scratch.
pub(crate) fn run_executables(scratch: &Path, run_id: &str) -> PathBuf {
    meshrun_ckpt::executable::dir(&meshrun_record::names::scratch_run(scratch, run_id))
}

/// Where a host's executables are: its workers' folder, and the run's
/// folder in the host's scratch (which may hold the host's own replica,
/// when it now runs where its buddy did).
pub(crate) struct ExecutablePlaces {
    own: PathBuf,
    run: PathBuf,
}

impl ExecutablePlaces {
    pub(crate) fn of(scratch: &Path, run_id: &str) -> Self {
        ExecutablePlaces {
            own: run_executables(scratch, run_id),
            run: meshrun_record::names::scratch_run(scratch, run_id),
        }
    }
}

/// Commits this host's part of a memory checkpoint, sends the replica to
/// the buddy with the executables it lacks, and says so. The executables
/// go before the word: the run may end once every host has given it, and
/// a keeper must not be writing into a run's folder it has removed.
pub(crate) async fn commit(
    m: memory::HostMemory,
    manifest: meshrun_ckpt::manifest::Manifest,
    buddy: Option<String>,
    token: Token,
    run_id: String,
    executables: (PathBuf, Arc<executables::Offered>),
    events: mpsc::UnboundedSender<FromAgent>,
) {
    let step = manifest.step;
    let local = m.clone();
    let committed = tokio::task::spawn_blocking(move || local.commit(&manifest))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    let (bytes, error, replicated) = match committed {
        Err(e) => (0, Some(e), false),
        Ok(bytes) => match &buddy {
            None => (bytes, None, false),
            Some(addr) => match memory::send_replica(addr, &token, &run_id, &m, step).await {
                Ok(()) => (bytes, None, true),
                Err(e) => (bytes, Some(e), false),
            },
        },
    };
    if let (true, Some(addr)) = (replicated, &buddy) {
        let (dir, offered) = &executables;
        if let Err(e) = executables::offer(addr, &token, &run_id, m.host(), dir, offered).await {
            tracing::warn!(step, "the executables' replica: {e}");
        }
    }
    let _ = events.send(FromAgent::MemoryHeld {
        step,
        bytes,
        replicated,
        error,
    });
}

/// Makes memory checkpoint `step` whole on this host: its own copy, else
/// the buddy's replica fetched back.
pub(crate) async fn prepare(
    m: memory::HostMemory,
    step: u64,
    buddy: Option<String>,
    token: Token,
    run_id: String,
    places: ExecutablePlaces,
    events: mpsc::UnboundedSender<FromAgent>,
) {
    let own = {
        let m = m.clone();
        tokio::task::spawn_blocking(move || {
            m.ready(step).map_err(|e| (e, m.adopt_local_replica(step)))
        })
        .await
        .unwrap_or_else(|e| Err((e.to_string(), Err(String::new()))))
    };
    let (source, why, bytes) = match own {
        Ok(bytes) => (Some("this host's memory".to_string()), None, bytes),
        Err((_, Ok(bytes))) => (
            Some("its replica on this machine (the host now runs where its buddy did)".to_string()),
            None,
            bytes,
        ),
        Err((missing, Err(_))) => match &buddy {
            None => (None, Some(missing), 0),
            Some(addr) => match memory::fetch_replica(addr, &token, &run_id, &m, step).await {
                Ok(bytes) => (Some(format!("the buddy's replica ({addr})")), None, bytes),
                Err(e) => (None, Some(format!("{missing}; {e}")), 0),
            },
        },
    };
    // Before the word: the workers start once every host has given it. A
    // buddy that could not give the memory back is not asked again (an
    // unreachable one would hold the restart up to the peer timeout).
    let ask = buddy.as_deref().filter(|_| source.is_some());
    let restored = executables::restore(&m, &places.run, ask, &token, &run_id, &places.own).await;
    let source = match (source, restored) {
        (Some(s), Ok(Some(from))) => Some(format!("{s}; executables: {from}")),
        (source, Err(e)) => {
            tracing::warn!(step, "the executables' replica: {e}");
            source
        }
        (source, _) => source,
    };
    let _ = events.send(FromAgent::MemoryPrepared {
        step,
        source,
        why,
        bytes,
    });
}
