//! Travelling executables replicated like memory checkpoints: after each
//! memory commit an agent offers its buddy the executables its workers
//! kept (`<scratch>/runs/<run>/executables/<key>.xla`), and the buddy takes
//! those it lacks into its own scratch (`runs/<run>/replica-of-<h>/
//! executables/`: on disk, not in the memory tier, whose bytes are the
//! checkpoints'; removed with the run's folder when the run ends). A
//! host that comes back without them (restarted on another machine) gets
//! them back with its memory checkpoint, before its workers start, so its
//! restart loads instead of compiling. An executable is never changed
//! under its name (a stale one is removed, and one compiled again is
//! written anew), so "lacks" is by name.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use meshrun_channel::Connection;
use meshrun_protocol::token::Token;
use meshrun_protocol::{ReplicaReply, ReplicaRequest};

use crate::memory::HostMemory;
use crate::transfer::{dial, files, plain, receive_files, send_files, PEER_TIMEOUT};

/// Numbers the transfer folders, so that two transfers never share one.
static TRANSFER: AtomicU64 = AtomicU64::new(0);

/// Where the keeper holds `host`'s executables, in the run's scratch folder.
fn kept(run_scratch: &Path, host: u32) -> PathBuf {
    HostMemory::replica(run_scratch, host).join(meshrun_ckpt::executable::EXECUTABLES)
}

/// `<key>.xla`: an executable's name (what the workers write is named so).
fn is_executable(name: &str) -> bool {
    Path::new(name).extension().is_some_and(|e| e == "xla")
}

/// The executables of `dir` whose writing is done (a file being written
/// has a temporary name until it is whole).
fn finished(dir: &Path) -> Vec<(String, u64)> {
    files(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| is_executable(n))
        .collect()
}

/// A transfer folder beside `dir`, its own.
fn transfer_dir(dir: &Path) -> PathBuf {
    let n = TRANSFER.fetch_add(1, Ordering::Relaxed);
    dir.with_extension(format!("transfer-{}-{n}", std::process::id()))
}

/// Receives `names` and moves them into `dir`, whole files only.
async fn receive_into<M: meshrun_protocol::Frame>(
    conn: &mut Connection,
    dir: &Path,
    names: &[(String, u64)],
) -> Result<(), String> {
    if let Some((bad, _)) = names.iter().find(|(n, _)| !is_executable(n)) {
        return Err(format!("refused the executable name {bad:?}"));
    }
    let tmp = transfer_dir(dir);
    let moved = async {
        receive_files::<M>(conn, &tmp, names).await?;
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| format!("cannot create '{}': {e}", dir.display()))?;
        for (name, _) in names {
            tokio::fs::rename(tmp.join(name), dir.join(name))
                .await
                .map_err(|e| format!("cannot move '{name}' into '{}': {e}", dir.display()))?;
        }
        Ok(())
    }
    .await;
    let _ = tokio::fs::remove_dir_all(&tmp).await;
    moved
}

/// What each buddy is known to hold already (by buddy address and file
/// name), so that a memory commit with no new executable costs no round
/// trip. Shared by an agent's commits.
#[derive(Debug, Default)]
pub struct Offered(Mutex<HashSet<(String, String)>>);

impl Offered {
    fn all_with(&self, buddy: &str, held: &[(String, u64)]) -> bool {
        let known = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.iter()
            .all(|(n, _)| known.contains(&(buddy.to_string(), n.clone())))
    }

    fn now_with(&self, buddy: &str, held: &[(String, u64)]) {
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        known.extend(held.iter().map(|(n, _)| (buddy.to_string(), n.clone())));
    }
}

/// Sends `request` to the buddy; gives the connection and its first answer.
async fn ask(
    buddy: &str,
    token: &Token,
    request: &ReplicaRequest,
) -> Result<(Connection, ReplicaReply), String> {
    let mut conn = dial(buddy, token).await?;
    conn.send(request)
        .await
        .map_err(|e| format!("the buddy at {buddy}: {e}"))?;
    match conn.recv_timeout::<ReplicaReply>(PEER_TIMEOUT).await {
        Ok(reply) => Ok((conn, reply)),
        Err(e) => Err(format!("no word from the buddy at {buddy}: {e}")),
    }
}

/// Offers the buddy this host's executables in `dir` and sends those it
/// lacks; gives how many were sent.
pub async fn offer(
    buddy: &str,
    token: &Token,
    run_id: &str,
    host: u32,
    dir: &Path,
    offered: &Offered,
) -> Result<usize, String> {
    let held = finished(dir);
    if held.is_empty() || offered.all_with(buddy, &held) {
        return Ok(0);
    }
    let offer = ReplicaRequest::ExecutablesOffer {
        run_id: run_id.to_string(),
        host,
        files: held.clone(),
    };
    let (mut conn, ReplicaReply::ExecutablesWanted { files: wanted }) =
        ask(buddy, token, &offer).await?
    else {
        return Err(format!("the buddy at {buddy} answered out of turn"));
    };
    // In the order offered: the order the keeper expects them in.
    let sending: Vec<_> = held
        .iter()
        .filter(|(n, _)| wanted.contains(n))
        .cloned()
        .collect();
    if sending.is_empty() {
        offered.now_with(buddy, &held);
        return Ok(0);
    }
    send_files(&mut conn, dir, &sending, ReplicaRequest::Raw).await?;
    match conn.recv_timeout::<ReplicaReply>(PEER_TIMEOUT).await {
        Ok(ReplicaReply::ExecutablesTaken { error: None }) => {
            offered.now_with(buddy, &held);
            Ok(sending.len())
        }
        Ok(ReplicaReply::ExecutablesTaken { error: Some(e) }) => {
            Err(format!("the buddy at {buddy} refused the executables: {e}"))
        }
        Ok(_) => Err(format!("the buddy at {buddy} answered out of turn")),
        Err(e) => Err(format!("no word from the buddy at {buddy}: {e}")),
    }
}

/// The keeper's side of an offer: says which it lacks, takes them.
pub(crate) async fn take(
    conn: &mut Connection,
    run_scratch: &Path,
    host: u32,
    offered: Vec<(String, u64)>,
) -> Result<(), String> {
    let dir = kept(run_scratch, host);
    let lacking: Vec<_> = offered
        .into_iter()
        .filter(|(n, _)| plain(n) && is_executable(n) && !dir.join(n).is_file())
        .collect();
    conn.send(&ReplicaReply::ExecutablesWanted {
        files: lacking.iter().map(|(n, _)| n.clone()).collect(),
    })
    .await
    .map_err(|e| e.to_string())?;
    if lacking.is_empty() {
        return Ok(());
    }
    let result = receive_into::<ReplicaRequest>(conn, &dir, &lacking).await;
    let error = result.clone().err();
    let _ = conn.send(&ReplicaReply::ExecutablesTaken { error }).await;
    result
}

/// The keeper's side of a fetch: every executable it holds for `host`.
pub(crate) async fn give(
    conn: &mut Connection,
    run_scratch: &Path,
    host: u32,
) -> Result<(), String> {
    let dir = kept(run_scratch, host);
    let names = finished(&dir);
    conn.send(&ReplicaReply::ExecutablesFiles {
        files: names.clone(),
    })
    .await
    .map_err(|e| e.to_string())?;
    send_files(conn, &dir, &names, ReplicaReply::Raw).await
}

/// Gives a host the executables kept for it: from this machine's scratch,
/// where its buddy ran before (the workers' folder `into` then holds the
/// buddy's own, which this host's ranks cannot use: the replica's are
/// added beside them), else from the buddy when `into` holds none. Says
/// where they came from, `None` when it needed none.
pub async fn restore(
    mem: &HostMemory,
    run_scratch: &Path,
    buddy: Option<&str>,
    token: &Token,
    run_id: &str,
    into: &Path,
) -> Result<Option<String>, String> {
    let here = kept(run_scratch, mem.host());
    let lacking: Vec<_> = finished(&here)
        .into_iter()
        .filter(|(n, _)| !into.join(n).is_file())
        .collect();
    if !lacking.is_empty() {
        tokio::fs::create_dir_all(into)
            .await
            .map_err(|e| format!("cannot create '{}': {e}", into.display()))?;
        for (name, _) in &lacking {
            tokio::fs::copy(here.join(name), into.join(name))
                .await
                .map_err(|e| format!("cannot copy '{name}': {e}"))?;
        }
        return Ok(Some(format!(
            "{} from this machine's replica",
            lacking.len()
        )));
    }
    if !finished(into).is_empty() {
        return Ok(None);
    }
    let Some(buddy) = buddy else {
        return Ok(None);
    };
    let get = ReplicaRequest::ExecutablesGet {
        run_id: run_id.to_string(),
        host: mem.host(),
    };
    let (mut conn, ReplicaReply::ExecutablesFiles { files: names }) =
        ask(buddy, token, &get).await?
    else {
        return Err(format!("the buddy at {buddy} answered out of turn"));
    };
    if names.is_empty() {
        return Ok(None);
    }
    receive_into::<ReplicaReply>(&mut conn, into, &names).await?;
    Ok(Some(format!("{} from the buddy ({buddy})", names.len())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshrun_protocol::token::Token;
    use meshrun_record::names::scratch_run;
    use tokio::net::TcpListener;

    fn exe(dir: &Path, name: &str, bytes: usize) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), vec![7u8; bytes]).unwrap();
    }

    /// A keeper agent's replica server, its memory and scratch under `dir`.
    async fn keeper(dir: &Path) -> (String, Token, tokio::task::JoinHandle<()>) {
        let token = Token::generate().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let serving = tokio::spawn(crate::memory::serve(
            listener,
            token.clone(),
            dir.join("keeper-memory"),
            dir.join("keeper-scratch"),
        ));
        (addr, token, serving)
    }

    #[tokio::test]
    async fn executables_go_to_the_buddy_once_and_come_back_to_a_host_without_them() {
        let tmp = tempfile::tempdir().unwrap();
        let (addr, token, serving) = keeper(tmp.path()).await;
        let keeper_scratch = tmp.path().join("keeper-scratch");

        let workers = tmp.path().join("host-1-executables");
        exe(&workers, "aa.xla", 700_000);
        exe(&workers, "bb.xla", 10);
        // Being written: not offered.
        exe(&workers, "cc.xla.tmp-42", 10);
        let offered = Offered::default();
        let offer_all = |offered| offer(&addr, &token, "run", 1, &workers, offered);
        assert_eq!(offer_all(&offered).await.unwrap(), 2);
        // Offered again: nothing new to send, by this agent's record or
        // (another agent's) by the keeper's answer. A new one: only it.
        assert_eq!(offer_all(&offered).await.unwrap(), 0);
        let fresh = Offered::default();
        assert_eq!(offer_all(&fresh).await.unwrap(), 0);
        exe(&workers, "dd.xla", 5);
        assert_eq!(offer_all(&offered).await.unwrap(), 1);
        // On the keeper's disk; its memory tier holds none of it.
        let keeper_run = scratch_run(&keeper_scratch, "run");
        let mut held: Vec<_> = finished(&kept(&keeper_run, 1))
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        held.sort();
        assert_eq!(held, ["aa.xla", "bb.xla", "dd.xla"]);
        assert!(!tmp.path().join("keeper-memory").exists());

        // Host 1 restarted elsewhere: nothing in its scratch or memory.
        let mem = HostMemory::new(&tmp.path().join("elsewhere-memory"), "run", 1);
        let run = scratch_run(&tmp.path().join("elsewhere"), "run");
        let into = run.join("executables");
        let from = restore(&mem, &run, Some(&addr), &token, "run", &into)
            .await
            .unwrap();
        assert_eq!(from, Some(format!("3 from the buddy ({addr})")));
        assert_eq!(
            std::fs::read(into.join("aa.xla")).unwrap(),
            vec![7u8; 700_000]
        );
        // A host that has its executables asks for none.
        let again = restore(&mem, &run, Some(&addr), &token, "run", &into)
            .await
            .unwrap();
        assert_eq!(again, None);

        // Host 1 now placed where its buddy ran: its replica is on this
        // machine already, and no buddy is asked. The workers' folder there
        // holds the buddy's own executables (other ranks' keys): host 1's
        // go beside them, the buddy's stay.
        let into = keeper_run.join("executables");
        exe(&into, "buddys-own.xla", 3);
        let from = restore(&mem, &keeper_run, None, &token, "run", &into)
            .await
            .unwrap();
        assert_eq!(from, Some("3 from this machine's replica".to_string()));
        assert_eq!(std::fs::read(into.join("dd.xla")).unwrap(), vec![7u8; 5]);
        assert_eq!(
            std::fs::read(into.join("buddys-own.xla")).unwrap(),
            vec![7u8; 3]
        );
        // Asked again: it has them all.
        let again = restore(&mem, &keeper_run, None, &token, "run", &into)
            .await
            .unwrap();
        assert_eq!(again, None);
        serving.abort();
    }

    #[tokio::test]
    async fn a_keeper_refuses_names_that_are_not_executables() {
        let tmp = tempfile::tempdir().unwrap();
        let (addr, token, serving) = keeper(tmp.path()).await;
        let mut conn = dial(&addr, &token).await.unwrap();
        conn.send(&ReplicaRequest::ExecutablesOffer {
            run_id: "run".into(),
            host: 0,
            files: vec![("../escape.xla".into(), 3), ("notes.txt".into(), 3)],
        })
        .await
        .unwrap();
        let wanted = conn
            .recv_timeout::<ReplicaReply>(PEER_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(wanted, ReplicaReply::ExecutablesWanted { files: vec![] });
        serving.abort();
    }
}
