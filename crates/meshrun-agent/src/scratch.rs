//! The host's own folder: what a host keeps for a run that no other host
//! needs to see (the function it was sent, its workers' stacks, JAX's
//! compilation cache). Names are `meshrun_record::names`'.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use meshrun_record::names;

/// Stacks beyond this are cut: a frame carries at most 1 MiB.
const MAX_STACKS_BYTES: usize = 512 * 1024;

/// `MESHRUN_SCRATCH`, else `meshrun-UID` in the system's temporary folder
/// (one per user: another user's folder would not be writable).
pub fn scratch_root() -> PathBuf {
    match std::env::var_os(names::SCRATCH_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => std::env::temp_dir().join(format!("meshrun-{}", nix::unistd::getuid())),
    }
}

/// One run's folder in a host's scratch folder, for one attempt.
pub struct RunScratch {
    root: PathBuf,
    dir: PathBuf,
    attempt: u32,
}

impl RunScratch {
    pub fn new(root: &Path, run_id: &str, attempt: u32) -> Self {
        Self {
            root: root.to_path_buf(),
            dir: names::scratch_run(root, run_id),
            attempt,
        }
    }

    /// Creates the folder and writes the function it was sent, if any. The
    /// error is worded for the user: every worker of the host fails with it.
    pub fn prepare(&self, function: Vec<u8>) -> Result<(), String> {
        let stacks = names::stacks_dir(&self.dir, self.attempt);
        std::fs::create_dir_all(&stacks).map_err(|e| {
            format!(
                "cannot create the host's scratch folder '{}' ({e}); set {} to a writable folder",
                stacks.display(),
                names::SCRATCH_ENV
            )
        })?;
        if !function.is_empty() {
            let path = self.dir.join(names::FUNCTION);
            std::fs::write(&path, function)
                .map_err(|e| format!("cannot write '{}': {e}", path.display()))?;
        }
        Ok(())
    }

    /// What a worker gets on top of its launch: its run's scratch folder,
    /// and the host's compilation cache unless the run names its own.
    pub fn worker_env(&self, launch_env: &[(String, String)]) -> Vec<(String, String)> {
        let mut env = vec![(
            names::SCRATCH_ENV.to_string(),
            self.dir.display().to_string(),
        )];
        let set =
            |key: &str| launch_env.iter().any(|(k, _)| k == key) || std::env::var_os(key).is_some();
        if !set("JAX_COMPILATION_CACHE_DIR") {
            env.push((
                "JAX_COMPILATION_CACHE_DIR".into(),
                self.root.join(names::COMPILE_CACHE).display().to_string(),
            ));
        }
        env
    }

    /// Where its workers write when they reached each step.
    pub fn steps_dir(&self) -> PathBuf {
        names::steps_dir(&self.dir, self.attempt)
    }

    /// Where its workers beat, each in its file, every idle second.
    pub fn beats_dir(&self) -> PathBuf {
        names::beats_dir(&self.dir, self.attempt)
    }

    pub fn stacks_reader(&self) -> StacksReader {
        StacksReader(names::stacks_dir(&self.dir, self.attempt))
    }

    /// The run is over: nothing of it stays on the host but the cache.
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads what workers wrote on SIGUSR1.
pub struct StacksReader(PathBuf);

impl StacksReader {
    /// Rank `rank`'s stacks, if it wrote any.
    pub fn read(&self, rank: u32) -> Option<String> {
        let bytes = std::fs::read(names::stack_file(&self.0, rank)).ok()?;
        if bytes.is_empty() {
            return None;
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if text.len() > MAX_STACKS_BYTES {
            let mut cut = MAX_STACKS_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[cut by meshrun: longer than 512 KiB]\n");
        }
        Some(text)
    }
}

/// Decodes one part of the function the controller sends.
pub fn append_base64(into: &mut Vec<u8>, data: &str) -> Result<(), base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode_vec(data, into)
}

/// Whether the storage marker at `path` holds `expect`; if not, what this
/// host sees there, in words.
pub fn check_marker(path: &str, expect: &str) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if text == expect => None,
        Ok(_) => Some(format!(
            "'{path}' on this host is another file than the controller's: the path \
             names a different folder here"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "the marker file '{path}' the controller wrote is not there on this host"
        )),
        Err(e) => Some(format!("cannot read the marker file '{path}' ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_matches_only_where_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, "abc").unwrap();
        let p = path.to_str().unwrap();
        assert_eq!(check_marker(p, "abc"), None);
        assert!(check_marker(p, "abd").unwrap().contains("another file"));
        let gone = dir.path().join("n");
        assert!(check_marker(gone.to_str().unwrap(), "abc")
            .unwrap()
            .contains("is not there"));
    }

    #[test]
    fn long_stacks_are_cut_on_a_character() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunScratch::new(dir.path(), "r", 1);
        run.prepare(b"fn".to_vec()).unwrap();
        assert_eq!(std::fs::read(run.dir.join(names::FUNCTION)).unwrap(), b"fn");
        let reader = run.stacks_reader();
        std::fs::write(
            names::stack_file(&reader.0, 0),
            "\u{e9}".repeat(MAX_STACKS_BYTES),
        )
        .unwrap();
        let text = reader.read(0).unwrap();
        assert!(text.len() < MAX_STACKS_BYTES + 100 && text.ends_with("512 KiB]\n"));
        assert_eq!(reader.read(1), None);
        run.remove();
        assert!(!dir.path().join("runs").join("r").exists());
    }
}
