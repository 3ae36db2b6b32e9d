//! The host's memory tier: the newest memory checkpoint of this host's
//! ranks, and the replica of its buddy's, in shared memory (a tmpfs), so
//! that a worker's death does not take them along.
//!
//! Layout under the run's folder (`<root>/<run_id>/`): `host-<h>/`, where
//! this host's workers write `tmp-<step>/rank-<r>.safetensors` and the
//! commit (the controller's manifest for this host) makes `step-<step>`;
//! `replica-of-<b>/step-<step>/`, the copy of host b's. A replica travels
//! between agents over a connection authenticated with the run token,
//! file by file in raw frames; a host that came back empty gets its own
//! step back the same way from its buddy.

use std::path::{Path, PathBuf};

use meshrun_channel::{auth, Connection};
use meshrun_ckpt::commit::{commit, step_dir, tmp_dir};
use meshrun_ckpt::manifest::{Manifest, MANIFEST};
use meshrun_ckpt::store::Location;
use meshrun_protocol::token::Token;
use meshrun_protocol::{ReplicaReply, ReplicaRequest};
use meshrun_record::names::scratch_run;
use tokio::net::TcpListener;

use crate::executables;
use crate::transfer::{dial, files, plain, receive_files, send_files, PEER_TIMEOUT};

/// Where memory checkpoints live when `MESHRUN_MEMORY_DIR` does not say.
pub const MEMORY_ENV: &str = meshrun_protocol::env::MEMORY_DIR;

/// `MESHRUN_MEMORY_DIR`, else `/dev/shm/meshrun-UID` (shared memory: it
/// outlives the worker and never touches a disk), else the scratch
/// folder's `memory/`.
pub fn memory_root(scratch: &Path) -> PathBuf {
    match std::env::var_os(MEMORY_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ if Path::new("/dev/shm").is_dir() => {
            PathBuf::from(format!("/dev/shm/meshrun-{}", nix::unistd::getuid()))
        }
        _ => scratch.join("memory"),
    }
}

/// One run's memory tier on this host.
#[derive(Debug, Clone)]
pub struct HostMemory {
    run: PathBuf,
    host: u32,
}

impl HostMemory {
    pub fn new(root: &Path, run_id: &str, host: u32) -> Self {
        Self {
            run: root.join(run_id),
            host,
        }
    }

    /// This host's rank among the run's hosts.
    pub(crate) fn host(&self) -> u32 {
        self.host
    }

    /// The folder this host's workers write into (`MESHRUN_MEMORY_DIR` of
    /// a worker).
    pub fn own(&self) -> PathBuf {
        self.run.join(format!("host-{}", self.host))
    }

    pub(crate) fn replica(run: &Path, of: u32) -> PathBuf {
        run.join(format!("replica-of-{of}"))
    }

    /// Commits this host's part of `manifest.step` (written by its
    /// workers into `tmp-<step>`); gives its bytes.
    pub fn commit(&self, manifest: &Manifest) -> Result<u64, String> {
        let own = self.own();
        let tmp = tmp_dir(&own, manifest.step);
        if let Some(missing) = missing_file(&tmp, manifest) {
            return Err(format!(
                "this host's file {missing} of memory checkpoint step {} is not in '{}'",
                manifest.step,
                tmp.display()
            ));
        }
        commit(&Location::Local(own.clone()), manifest).map_err(|e| e.to_string())?;
        Ok(files(&step_dir(&own, manifest.step))?
            .iter()
            .map(|(_, n)| n)
            .sum())
    }

    /// Step `step` is committed everywhere: what is older goes, own and
    /// replicas alike.
    pub fn release(&self, step: u64) {
        let mut dirs = vec![self.own()];
        if let Ok(entries) = std::fs::read_dir(&self.run) {
            dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("replica-of-"))
            }));
        }
        for dir in dirs {
            drop_steps(&dir, step);
        }
    }

    /// Whether this host's own copy of `step` is whole: its manifest and
    /// every file the manifest names. Gives its bytes.
    pub fn ready(&self, step: u64) -> Result<u64, String> {
        let dir = step_dir(&self.own(), step);
        let manifest = meshrun_ckpt::manifest::read(&Location::Local(dir.clone()))
            .map_err(|_| format!("this host holds no memory checkpoint of step {step}"))?;
        if let Some(missing) = missing_file(&dir, &manifest) {
            return Err(format!("this host's copy of step {step} lacks {missing}"));
        }
        let mut bytes = 0;
        for (_, n) in files(&dir)? {
            bytes += n;
        }
        Ok(bytes)
    }

    /// This host's `step` from a replica of it kept on this machine: a
    /// host placed (by Ray, say) where its buddy ran in the last attempt
    /// finds its own replica here. Gives its bytes.
    pub fn adopt_local_replica(&self, step: u64) -> Result<u64, String> {
        let replica = step_dir(&Self::replica(&self.run, self.host), step);
        if !replica.join(MANIFEST).is_file() {
            return Err(format!("no replica of step {step} on this machine either"));
        }
        let own = self.own();
        std::fs::create_dir_all(&own)
            .map_err(|e| format!("cannot create '{}': {e}", own.display()))?;
        let done = step_dir(&own, step);
        let _ = std::fs::remove_dir_all(&done);
        std::fs::rename(&replica, &done)
            .map_err(|e| format!("cannot move '{}': {e}", replica.display()))?;
        self.ready(step)
    }

    /// The run is over: its memory goes.
    pub fn remove_run(&self) {
        let _ = std::fs::remove_dir_all(&self.run);
    }
}

/// The first file `manifest` names that `dir` does not hold.
fn missing_file(dir: &Path, manifest: &Manifest) -> Option<String> {
    manifest
        .leaves
        .iter()
        .flat_map(|l| &l.shards)
        .find(|s| !dir.join(&s.file).is_file())
        .map(|s| s.file.clone())
}

/// Removes the `step-*` and `tmp-*` folders of `dir` older than `step`.
fn drop_steps(dir: &Path, step: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let older = name
            .strip_prefix("step-")
            .or_else(|| name.strip_prefix("tmp-"))
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| s < step);
        if older {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Sends this host's committed step to the buddy and waits for its word.
pub async fn send_replica(
    buddy: &str,
    token: &Token,
    run_id: &str,
    mem: &HostMemory,
    step: u64,
) -> Result<(), String> {
    let dir = step_dir(&mem.own(), step);
    let names = files(&dir)?;
    let mut conn = dial(buddy, token).await?;
    conn.send(&ReplicaRequest::ReplicaPut {
        run_id: run_id.to_string(),
        host: mem.host,
        step,
        files: names.clone(),
    })
    .await
    .map_err(|e| format!("the buddy at {buddy}: {e}"))?;
    send_files(&mut conn, &dir, &names, ReplicaRequest::Raw).await?;
    match conn.recv_timeout::<ReplicaReply>(PEER_TIMEOUT).await {
        Ok(ReplicaReply::ReplicaAck { error: None, .. }) => Ok(()),
        Ok(ReplicaReply::ReplicaAck { error: Some(e), .. }) => {
            Err(format!("the buddy at {buddy} refused the replica: {e}"))
        }
        Ok(_) => Err(format!("the buddy at {buddy} answered out of turn")),
        Err(e) => Err(format!("no word from the buddy at {buddy}: {e}")),
    }
}

/// Fetches the buddy's replica of this host's `step` into this host's own
/// folder; gives its bytes.
pub async fn fetch_replica(
    buddy: &str,
    token: &Token,
    run_id: &str,
    mem: &HostMemory,
    step: u64,
) -> Result<u64, String> {
    let mut conn = dial(buddy, token).await?;
    conn.send(&ReplicaRequest::ReplicaGet {
        run_id: run_id.to_string(),
        host: mem.host,
        step,
    })
    .await
    .map_err(|e| format!("the buddy at {buddy}: {e}"))?;
    let names = match conn.recv_timeout::<ReplicaReply>(PEER_TIMEOUT).await {
        Ok(ReplicaReply::ReplicaFiles { files, step: s }) if s == step => files,
        Ok(ReplicaReply::ReplicaAck { error: Some(e), .. }) => return Err(e),
        Ok(_) => return Err(format!("the buddy at {buddy} answered out of turn")),
        Err(e) => return Err(format!("no word from the buddy at {buddy}: {e}")),
    };
    let own = mem.own();
    let tmp = tmp_dir(&own, step);
    let bytes = receive_files::<ReplicaReply>(&mut conn, &tmp, &names).await?;
    let done = step_dir(&own, step);
    let _ = tokio::fs::remove_dir_all(&done).await;
    tokio::fs::rename(&tmp, &done)
        .await
        .map_err(|e| format!("cannot commit '{}': {e}", done.display()))?;
    // What came back must be whole, as the host's own copy would have to be.
    mem.ready(step)
        .map_err(|e| format!("the buddy's replica: {e}"))?;
    Ok(bytes)
}

/// Takes replicas from other hosts' agents and gives them back, for as
/// long as the agent's session lasts: memory checkpoints under `root` (the
/// memory tier), executables under `scratch` (the host's disk).
pub async fn serve(listener: TcpListener, token: Token, root: PathBuf, scratch: PathBuf) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            return;
        };
        let token = token.clone();
        let root = root.clone();
        let scratch = scratch.clone();
        tokio::spawn(async move {
            let Ok(mut conn) = auth::accept(stream, &token).await else {
                tracing::warn!(%peer, "replica connection refused: it did not prove the run token");
                return;
            };
            if let Err(e) = answer(&mut conn, &root, &scratch).await {
                tracing::warn!(%peer, "replica transfer failed: {e}");
            }
        });
    }
}

async fn answer(conn: &mut Connection, root: &Path, scratch: &Path) -> Result<(), String> {
    match conn
        .recv_timeout::<ReplicaRequest>(PEER_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?
    {
        ReplicaRequest::ReplicaPut {
            run_id,
            host,
            step,
            files,
        } if plain(&run_id) => {
            let replica = HostMemory::replica(&root.join(&run_id), host);
            // The older replica stays until the controller releases it
            // (`HostMemory::release`, once the newer step is committed on
            // every host): a host that dies between sending this replica
            // and the commit restarts from the older step, which its
            // buddy must then still hold.
            let tmp = tmp_dir(&replica, step);
            let result = match receive_files::<ReplicaRequest>(conn, &tmp, &files).await {
                Ok(_) => {
                    let done = step_dir(&replica, step);
                    let _ = tokio::fs::remove_dir_all(&done).await;
                    tokio::fs::rename(&tmp, &done)
                        .await
                        .map_err(|e| format!("cannot commit '{}': {e}", done.display()))
                }
                Err(e) => {
                    let _ = tokio::fs::remove_dir_all(&tmp).await;
                    Err(e)
                }
            };
            let error = result.clone().err();
            let _ = conn.send(&ReplicaReply::ReplicaAck { step, error }).await;
            result
        }
        ReplicaRequest::ReplicaGet { run_id, host, step } if plain(&run_id) => {
            let run = root.join(&run_id);
            // The replica, or host `host`'s own copy when that host ran on
            // this machine in the last attempt (Ray may place hosts anew).
            let dir = [
                HostMemory::replica(&run, host),
                run.join(format!("host-{host}")),
            ]
            .into_iter()
            .map(|d| step_dir(&d, step))
            .find(|d| d.join(MANIFEST).is_file())
            .unwrap_or_else(|| step_dir(&HostMemory::replica(&run, host), step));
            match files(&dir) {
                Ok(names) if names.iter().any(|(n, _)| n == MANIFEST) => {
                    conn.send(&ReplicaReply::ReplicaFiles {
                        step,
                        files: names.clone(),
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                    send_files(conn, &dir, &names, ReplicaReply::Raw).await
                }
                _ => {
                    let error = format!("host {host}'s buddy holds no replica of step {step}");
                    let _ = conn
                        .send(&ReplicaReply::ReplicaAck {
                            step,
                            error: Some(error.clone()),
                        })
                        .await;
                    Err(error)
                }
            }
        }
        ReplicaRequest::ExecutablesOffer {
            run_id,
            host,
            files,
        } if plain(&run_id) => {
            executables::take(conn, &scratch_run(scratch, &run_id), host, files).await
        }
        ReplicaRequest::ExecutablesGet { run_id, host } if plain(&run_id) => {
            executables::give(conn, &scratch_run(scratch, &run_id), host).await
        }
        ReplicaRequest::ReplicaPut { run_id, .. }
        | ReplicaRequest::ReplicaGet { run_id, .. }
        | ReplicaRequest::ExecutablesOffer { run_id, .. }
        | ReplicaRequest::ExecutablesGet { run_id, .. } => {
            Err(format!("refused the run id {run_id:?}"))
        }
        ReplicaRequest::Raw(_) => Err("file bytes before a request".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(step: u64) -> Manifest {
        Manifest {
            format: meshrun_ckpt::manifest::FORMAT_VERSION,
            step,
            leaves: vec![],
            files: vec![],
            extra: serde_json::Value::Null,
            attempt: Some(1),
        }
    }

    #[tokio::test]
    async fn a_replica_goes_to_the_buddy_and_comes_back() {
        let tmp = tempfile::tempdir().unwrap();
        let token = Token::generate().unwrap();
        let (a_root, b_root) = (tmp.path().join("a"), tmp.path().join("b"));
        let a = HostMemory::new(&a_root, "run1", 0);
        let tmpdir = tmp_dir(&a.own(), 7);
        std::fs::create_dir_all(&tmpdir).unwrap();
        let data: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(tmpdir.join("rank-0.safetensors"), &data).unwrap();
        assert_eq!(
            a.commit(&manifest(7)).unwrap(),
            data.len() as u64
                + std::fs::metadata(step_dir(&a.own(), 7).join(MANIFEST))
                    .unwrap()
                    .len()
        );

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(
            listener,
            token.clone(),
            b_root.clone(),
            tmp.path().join("b-scratch"),
        ));
        send_replica(&addr, &token, "run1", &a, 7).await.unwrap();
        let held = b_root.join("run1/replica-of-0/step-7/rank-0.safetensors");
        assert_eq!(std::fs::read(&held).unwrap(), data);

        // Host 0 comes back empty and gets its step from the buddy.
        std::fs::remove_dir_all(&a_root).unwrap();
        assert!(a.ready(7).is_err());
        fetch_replica(&addr, &token, "run1", &a, 7).await.unwrap();
        assert!(a.ready(7).is_ok());
        assert_eq!(
            std::fs::read(step_dir(&a.own(), 7).join("rank-0.safetensors")).unwrap(),
            data
        );

        // A step the buddy does not hold is said to be missing.
        let err = fetch_replica(&addr, &token, "run1", &a, 8)
            .await
            .unwrap_err();
        assert!(err.contains("no replica of step 8"), "{err}");
        // A host placed where its buddy ran finds its replica there...
        let moved = HostMemory::new(&b_root, "run1", 0);
        assert!(moved.ready(7).is_err());
        assert_eq!(
            moved.adopt_local_replica(7).unwrap(),
            moved.ready(7).unwrap()
        );
        // ...and a buddy that now runs where the host ran serves the
        // host's own copy.
        let elsewhere = HostMemory::new(&tmp.path().join("c"), "run1", 0);
        fetch_replica(&addr, &token, "run1", &elsewhere, 7)
            .await
            .unwrap();
        assert!(elsewhere.ready(7).is_ok());
        // Another token is turned away.
        let err = fetch_replica(&addr, &Token::generate().unwrap(), "run1", &a, 7)
            .await
            .unwrap_err();
        assert!(
            err.contains("did not accept") || err.contains("no word"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_newer_replica_keeps_the_older_until_it_is_released() {
        let tmp = tempfile::tempdir().unwrap();
        let token = Token::generate().unwrap();
        let (a_root, b_root) = (tmp.path().join("a"), tmp.path().join("b"));
        let a = HostMemory::new(&a_root, "run1", 0);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(
            listener,
            token.clone(),
            b_root.clone(),
            tmp.path().join("b-scratch"),
        ));
        for step in [7, 8] {
            let tmpdir = tmp_dir(&a.own(), step);
            std::fs::create_dir_all(&tmpdir).unwrap();
            std::fs::write(tmpdir.join("rank-0.safetensors"), [step as u8; 64]).unwrap();
            a.commit(&manifest(step)).unwrap();
            send_replica(&addr, &token, "run1", &a, step).await.unwrap();
        }
        // Host 0 died after sending step 8, before step 8 was committed
        // everywhere: the restart asks for step 7, which must still be held.
        let replica = |s: u64| b_root.join(format!("run1/replica-of-0/step-{s}"));
        assert!(replica(7).is_dir() && replica(8).is_dir());
        std::fs::remove_dir_all(&a_root).unwrap();
        fetch_replica(&addr, &token, "run1", &a, 7).await.unwrap();
        assert_eq!(
            std::fs::read(step_dir(&a.own(), 7).join("rank-0.safetensors")).unwrap(),
            [7u8; 64]
        );
        // Once step 8 is committed everywhere, step 7's replica goes.
        HostMemory::new(&b_root, "run1", 1).release(8);
        assert!(!replica(7).exists() && replica(8).is_dir());
    }

    #[test]
    fn release_keeps_the_newest_step_only() {
        let tmp = tempfile::tempdir().unwrap();
        let m = HostMemory::new(tmp.path(), "r", 1);
        for d in [
            "host-1/step-3",
            "host-1/step-4",
            "host-1/tmp-2",
            "host-1/tmp-5",
            "replica-of-0/step-3",
            "replica-of-0/step-4",
        ] {
            std::fs::create_dir_all(tmp.path().join("r").join(d)).unwrap();
        }
        m.release(4);
        let left: Vec<bool> = [
            "host-1/step-3",
            "host-1/step-4",
            "host-1/tmp-2",
            "host-1/tmp-5",
            "replica-of-0/step-3",
            "replica-of-0/step-4",
        ]
        .iter()
        .map(|d| tmp.path().join("r").join(d).exists())
        .collect();
        assert_eq!(left, [false, true, false, true, false, true]);
    }
}
