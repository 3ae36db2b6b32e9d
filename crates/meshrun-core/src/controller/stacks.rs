//! Reading the stack dumps of a stopped attempt: where, in the user's own
//! code, each rank was when the group was stopped. A hang summary shows
//! that line per rank, so the user sees who waited where without opening
//! a file.

use std::path::Path;

/// The innermost frame of the user's code in one rank's faulthandler dump
/// ("File "train.py", line 42 in step"), as `train.py:42 in step`.
///
/// faulthandler lists every thread, most recent call first; the thread that
/// took the signal is marked "Current thread" and is looked at first. A
/// frame is the user's unless it is Python's own, an installed package's,
/// or meshrun's.
pub fn user_frame(dump: &str) -> Option<String> {
    let mut threads: Vec<(bool, Vec<&str>)> = Vec::new();
    for line in dump.lines() {
        if line.starts_with("Thread ") || line.starts_with("Current thread ") {
            threads.push((line.starts_with("Current"), Vec::new()));
        } else if let (Some(frame), Some((_, frames))) =
            (line.trim_start().strip_prefix("File "), threads.last_mut())
        {
            frames.push(frame);
        }
    }
    threads.sort_by_key(|(current, _)| !current);
    threads
        .iter()
        .flat_map(|(_, frames)| frames.iter())
        .find_map(|frame| parse(frame).filter(|(file, ..)| is_users(file)))
        .map(|(file, line, func)| format!("{file}:{line} in {func}"))
}

/// `"x.py", line 3 in f` -> ("x.py", "3", "f").
fn parse(frame: &str) -> Option<(&str, &str, &str)> {
    let rest = frame.strip_prefix('"')?;
    let (file, rest) = rest.split_once('"')?;
    let rest = rest.trim_start().strip_prefix(", line ")?;
    let (line, func) = rest.split_once(" in ")?;
    Some((file, line.trim(), func.trim()))
}

fn is_users(file: &str) -> bool {
    let path = Path::new(file);
    let own = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|dir| dir == "meshrun");
    !(own
        || file.starts_with('<')
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.contains("/lib/python3"))
}

/// Some rank wrote its stacks into `dir`.
pub fn any_written(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.metadata().is_ok_and(|m| m.len() > 0))
}

/// Every rank's innermost user frame, from `stacks_dir/rank-R.txt`.
pub fn frames(stacks_dir: &Path, nprocs: u32) -> Vec<(u32, String)> {
    (0..nprocs)
        .filter_map(|rank| {
            let dump = std::fs::read_to_string(meshrun_record::names::stack_file(stacks_dir, rank))
                .ok()?;
            Some((rank, user_frame(&dump)?))
        })
        .collect()
}

/// Workers open their stack files when they start; the empty ones of an
/// attempt that dumped nothing are removed, and the folders with them.
pub fn tidy(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.metadata().is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"Thread 0x00007f0b5e7fc6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/home/u/proj/loader.py", line 9 in worker

Current thread 0x00007f0b6a1b8740 (most recent call first):
  File "/home/u/.venv/lib/python3.11/site-packages/jax/_src/array.py", line 640 in _value
  File "/home/u/proj/train.py", line 42 in step
  File "/home/u/proj/train.py", line 60 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/home/u/proj/python/meshrun/_bootstrap.py", line 22 in _run
"#;

    #[test]
    fn the_innermost_user_frame_of_the_signalled_thread() {
        assert_eq!(
            user_frame(DUMP).as_deref(),
            Some("/home/u/proj/train.py:42 in step")
        );
    }

    #[test]
    fn no_user_frame_is_none() {
        let dump = "Current thread 0x1 (most recent call first):\n  File \"<frozen runpy>\", line 88 in _run_code\n";
        assert_eq!(user_frame(dump), None);
        assert_eq!(user_frame(""), None);
    }
}
