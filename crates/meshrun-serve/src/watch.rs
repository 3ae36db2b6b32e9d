//! Noticing that a run (or any run of a folder) changed: the sizes and
//! modification times of the files the pages are drawn from.

use std::path::Path;
use std::time::{Duration, SystemTime};

use meshrun_record::names;

/// How often a stream looks for changes.
pub const POLL: Duration = Duration::from_millis(500);

/// The files a page is drawn from.
const DRAWN_FROM: [&str; 5] = [
    names::RUN_JSON,
    names::EVENTS,
    names::METRICS,
    names::GOODPUT,
    names::MEMORY,
];

/// Size and modification time of each drawn-from file of `dir` (a run
/// folder), or of every run folder in it (a runs folder), in a fixed
/// order: two equal fingerprints mean nothing drawn changed.
pub fn fingerprint(dir: &Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    if dir.join(names::RUN_JSON).exists() || dir.join(names::EVENTS).exists() {
        files(dir, &mut out);
        return out;
    }
    let mut runs: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    runs.sort();
    for run in runs {
        out.push((run.display().to_string(), 0, None));
        files(&run, &mut out);
    }
    out
}

fn files(dir: &Path, out: &mut Vec<(String, u64, Option<SystemTime>)>) {
    for name in DRAWN_FROM {
        let path = dir.join(name);
        if let Ok(meta) = std::fs::metadata(&path) {
            out.push((path.display().to_string(), meta.len(), meta.modified().ok()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_appended_line_or_a_new_run_changes_the_fingerprint() {
        let root = tempfile::TempDir::new().unwrap();
        let run = root.path().join("a");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join(names::EVENTS), "{}\n").unwrap();
        let (before, run_before) = (fingerprint(root.path()), fingerprint(&run));
        assert_eq!(before, fingerprint(root.path()), "nothing changed");
        std::fs::write(run.join(names::EVENTS), "{}\n{}\n").unwrap();
        assert_ne!(fingerprint(&run), run_before);
        assert_ne!(fingerprint(root.path()), before);
        let now = fingerprint(root.path());
        std::fs::create_dir(root.path().join("b")).unwrap();
        assert_ne!(fingerprint(root.path()), now);
    }
}
