//! A worker's profile trace, sent over its control connection: every file
//! under the trace's folder as a `ProfileFile` header and its bytes in raw
//! frames, read and sent a chunk at a time (a trace can be gigabytes; the
//! training process must not hold one whole).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use meshrun_channel::BlockingWriter;
use meshrun_protocol::FromWorker;

/// Raw frames of a file in transfer carry this much each.
const FILE_CHUNK_BYTES: usize = 512 * 1024;

pub enum FileSendError {
    /// The connection failed: the writer ends.
    Net,
    /// A file could not be read: said in `ProfileDone`.
    Read(String),
}

/// Sends every file under `dir`. A header promises a size: a file that
/// turns out shorter (or fails to read midway) is padded to it with zeros,
/// so the controller is never left waiting for bytes, and the error is
/// returned for `ProfileDone` to say (the controller then counts the
/// rank's trace as missing, not saved).
pub fn send_files<W: Write>(
    out: &mut BlockingWriter<W>,
    capture: &str,
    dir: &Path,
) -> Result<(), FileSendError> {
    let mut failed = None;
    for path in files_under(dir)? {
        let name = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        let opened = std::fs::File::open(&path).and_then(|f| Ok((f.metadata()?.len(), f)));
        let (size, file) = match opened {
            Ok(found) => found,
            Err(e) => {
                failed.get_or_insert(format!("cannot read '{}': {e}", path.display()));
                continue;
            }
        };
        let head = FromWorker::ProfileFile {
            capture: capture.to_string(),
            name,
            size,
        };
        out.put(&head).map_err(|_| FileSendError::Net)?;
        if let Err(e) = send_bytes(out, file, size)? {
            failed.get_or_insert(format!("cannot read '{}': {e}", path.display()));
        }
    }
    failed.map_or(Ok(()), |e| Err(FileSendError::Read(e)))
}

/// `size` bytes of `file` in raw frames; the outer error is the
/// connection's, the inner one the file's (the rest then sent as zeros).
fn send_bytes<W: Write>(
    out: &mut BlockingWriter<W>,
    mut file: std::fs::File,
    size: u64,
) -> Result<Result<(), String>, FileSendError> {
    let mut result = Ok(());
    let mut left = size;
    let mut buf = vec![0u8; FILE_CHUNK_BYTES];
    while left > 0 {
        let want = usize::try_from(left).map_or(FILE_CHUNK_BYTES, |l| l.min(FILE_CHUNK_BYTES));
        let chunk = &mut buf[..want];
        if result.is_ok() {
            match file.read_exact(chunk) {
                Ok(()) => {}
                Err(e) => {
                    result = Err(e.to_string());
                    chunk.fill(0);
                }
            }
        } else {
            chunk.fill(0);
        }
        out.put(&FromWorker::Raw(bytes::Bytes::copy_from_slice(chunk)))
            .map_err(|_| FileSendError::Net)?;
        left -= want as u64;
    }
    Ok(result)
}

/// The files under `dir`, in name order.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>, FileSendError> {
    let mut pending = vec![dir.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = pending.pop() {
        let entries = std::fs::read_dir(&d)
            .map_err(|e| FileSendError::Read(format!("cannot list '{}': {e}", d.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use meshrun_channel::auth;
    use meshrun_protocol::token::Token;

    use super::*;

    /// What the controller reads: (name, size, bytes) per file.
    fn received(wire: &[u8], keys: meshrun_channel::Keys) -> Vec<(String, u64, Vec<u8>)> {
        let (mut r, _) = keys.into_blocking(wire, std::io::sink());
        let mut files: Vec<(String, u64, Vec<u8>)> = Vec::new();
        while let Ok(msg) = r.recv::<FromWorker>() {
            match msg {
                FromWorker::ProfileFile { name, size, .. } => files.push((name, size, Vec::new())),
                FromWorker::Raw(data) => files.last_mut().unwrap().2.extend_from_slice(&data),
                other => panic!("{other:?}"),
            }
        }
        files
    }

    #[test]
    fn files_go_in_chunks_each_its_promised_size() {
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..FILE_CHUNK_BYTES * 2 + 7)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::create_dir_all(dir.path().join("plugins/x")).unwrap();
        std::fs::write(dir.path().join("plugins/x/h.xplane.pb"), &big).unwrap();
        std::fs::write(dir.path().join("a.json"), b"{}").unwrap();
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        let token = Token::generate().unwrap();
        let (client, server) = auth::handshake_in_memory(&token);
        let (_, mut w) = client.into_blocking(std::io::empty(), Vec::new());
        assert!(send_files(&mut w, "c", dir.path()).is_ok());
        w.flush().unwrap();
        let files = received(w.get_ref(), server);
        let names: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["a.json", "empty", "plugins/x/h.xplane.pb"]);
        assert_eq!(files[0].2, b"{}");
        assert_eq!((files[1].1, files[1].2.len()), (0, 0));
        assert_eq!(files[2].1, big.len() as u64);
        assert!(files[2].2 == big, "the big file arrives whole");
    }

    #[test]
    fn an_unreadable_file_is_said_and_the_others_still_go() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.json"), b"{}").unwrap();
        // A dangling link: listed, but it cannot be opened.
        std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("b.pb")).unwrap();
        std::fs::write(dir.path().join("c.json"), b"[]").unwrap();
        let token = Token::generate().unwrap();
        let (client, server) = auth::handshake_in_memory(&token);
        let (_, mut w) = client.into_blocking(std::io::empty(), Vec::new());
        let Err(FileSendError::Read(why)) = send_files(&mut w, "c", dir.path()) else {
            panic!("the unreadable file is said")
        };
        assert!(why.contains("b.pb"), "{why}");
        w.flush().unwrap();
        let files = received(w.get_ref(), server);
        let names: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["a.json", "c.json"]);
    }
}
