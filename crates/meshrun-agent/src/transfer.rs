//! Files between agents: a connection to a peer agent, authenticated with
//! the run token, and plain files sent over it in raw frames. The memory
//! tier's replicas (`memory`) and the executables' (`executables`) travel
//! this way.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use meshrun_channel::{auth, Connection};
use meshrun_protocol::token::Token;
use meshrun_protocol::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Raw frames carry this much of a file each (a frame holds 1 MiB).
const PIECE_BYTES: usize = 512 * 1024;

/// A peer that stops answering mid-transfer is given up on after this.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// A name that is one plain path component: what a peer may name.
pub(crate) fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// The plain files of a folder, by name, with their sizes.
pub(crate) fn files(dir: &Path) -> Result<Vec<(String, u64)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read '{}': {e}", dir.display()))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let meta = e
            .metadata()
            .map_err(|err| format!("cannot read '{}': {err}", e.path().display()))?;
        if meta.is_file() {
            out.push((e.file_name().to_string_lossy().into_owned(), meta.len()));
        }
    }
    out.sort();
    Ok(out)
}

pub(crate) async fn dial(addr: &str, token: &Token) -> Result<Connection, String> {
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("bad buddy address '{addr}': {e}"))?;
    let stream = tokio::time::timeout(PEER_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("no answer from the buddy at {addr}"))?
        .map_err(|e| format!("cannot reach the buddy at {addr}: {e}"))?;
    auth::connect(stream, token)
        .await
        .map_err(|e| format!("the buddy at {addr} did not accept the connection: {e}"))
}

/// Sends the files of `dir`, in order, as raw frames.
pub(crate) async fn send_files<M: Frame>(
    conn: &mut Connection,
    dir: &Path,
    names: &[(String, u64)],
    raw: fn(Bytes) -> M,
) -> Result<(), String> {
    let mut buf = vec![0u8; PIECE_BYTES];
    for (name, size) in names {
        let path = dir.join(name);
        let mut f = tokio::fs::File::open(&path)
            .await
            .map_err(|e| format!("cannot open '{}': {e}", path.display()))?;
        let mut left = *size;
        while left > 0 {
            let want = (left as usize).min(PIECE_BYTES);
            f.read_exact(&mut buf[..want])
                .await
                .map_err(|e| format!("cannot read '{}': {e}", path.display()))?;
            conn.send(&raw(Bytes::copy_from_slice(&buf[..want])))
                .await
                .map_err(|e| format!("sending '{name}': {e}"))?;
            left -= want as u64;
        }
    }
    Ok(())
}

/// Receives `names` as raw frames into `dir` (created afresh).
pub(crate) async fn receive_files<M: Frame>(
    conn: &mut Connection,
    dir: &Path,
    names: &[(String, u64)],
) -> Result<u64, String> {
    if let Some(bad) = names.iter().find(|(n, _)| !plain(n)) {
        return Err(format!("refused the file name {:?}", bad.0));
    }
    let _ = tokio::fs::remove_dir_all(dir).await;
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| format!("cannot create '{}': {e}", dir.display()))?;
    let mut total = 0;
    for (name, size) in names {
        let path = dir.join(name);
        let mut f = tokio::fs::File::create(&path)
            .await
            .map_err(|e| format!("cannot create '{}': {e}", path.display()))?;
        let mut left = *size;
        while left > 0 {
            let piece = match conn.recv_timeout::<M>(PEER_TIMEOUT).await {
                Ok(msg) if msg.raw().is_some_and(|d| d.len() as u64 <= left) => {
                    msg.raw().cloned().unwrap_or_default()
                }
                Ok(_) => return Err(format!("'{name}' did not arrive as announced")),
                Err(e) => return Err(format!("receiving '{name}': {e}")),
            };
            f.write_all(&piece)
                .await
                .map_err(|e| format!("cannot write '{}': {e}", path.display()))?;
            left -= piece.len() as u64;
        }
        f.flush()
            .await
            .map_err(|e| format!("cannot write '{}': {e}", path.display()))?;
        total += size;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_name_plain_files_only() {
        assert!(plain("rank-0.safetensors"));
        for bad in ["", ".", "..", "a/b", "../x", "a\\b"] {
            assert!(!plain(bad), "{bad}");
        }
    }
}
