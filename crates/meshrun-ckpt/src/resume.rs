//! Which committed checkpoint a run resumes from.
//!
//! The newest checkpoint cannot be trusted blindly: a damaged one (a
//! flipped byte, a shard file gone, a manifest cut short) would fail the
//! restore of every attempt in turn and use up the run's restarts. So
//! before each attempt the controller verifies the checkpoints newest first
//! and resumes from the first that verifies ([`newest_verified`]); the ones
//! it skips stay where they are, for the user to inspect. A step asked for
//! explicitly is checked before the run starts ([`check_requested`]), and
//! the checkpoints newer than it are set aside ([`supersede_newer`]), so
//! that later restarts, and later runs under the same name, carry on from
//! the step asked for rather than jumping back to the abandoned ones.
//!
//! The controller hands its choice to the workers; [`for_attempt`] is what
//! a worker then gives out as its checkpoint.

use crate::commit::{committed, set_aside, step_at};
use crate::error::CkptError;
use crate::read::Reader;
use crate::store::Location;

/// The folder of a run's checkpoints, inside its run directory.
pub const CHECKPOINTS: &str = "checkpoints";

/// What a checkpoint that was set aside is renamed to: `<label>-step-N`.
pub const SUPERSEDED: &str = "superseded";
pub const DAMAGED: &str = "damaged";

/// Reads every byte of a checkpoint and checks it: every CRC, that each
/// shard file holds what the manifest says ([`Reader::verify_all`]: an
/// error there is damage), then that every leaf can be restored whole
/// ([`Reader::check_whole`]: an error there is how it was committed).
/// Returns how many tensors.
pub fn verify(dir: &Location) -> Result<usize, CkptError> {
    let mut reader = Reader::open(dir)?;
    let n = reader.verify_all()?;
    reader.check_whole()?;
    Ok(n)
}

/// A checkpoint passed over, and why.
#[derive(Debug)]
pub struct Skipped {
    pub step: u64,
    pub path: Location,
    pub error: CkptError,
}

/// Where an attempt resumes from.
#[derive(Debug, Default)]
pub struct Choice {
    /// `None`: from the beginning (nothing committed).
    pub step: Option<u64>,
    /// The newer checkpoints that are damaged, newest first.
    pub skipped: Vec<Skipped>,
}

/// The newest committed checkpoint under `root` that verifies. Only a
/// damaged one ([`CkptError::is_damage`]) is passed over for an older one:
/// a checkpoint that is whole but cannot be read (the storage failing, a
/// leaf committed without all its shards) fails the choice, naming it, and
/// so does a run whose committed checkpoints are all damaged: a restart
/// never starts from the beginning by itself while checkpoints exist.
pub fn newest_verified(root: &Location) -> Result<Choice, CkptError> {
    choose(&committed(root)?, |dir| verify(dir).map(drop))
}

fn choose(
    candidates: &[(u64, Location)],
    verify: impl Fn(&Location) -> Result<(), CkptError>,
) -> Result<Choice, CkptError> {
    let mut choice = Choice::default();
    for (step, path) in candidates.iter().rev() {
        match verify(path) {
            Ok(()) => {
                choice.step = Some(*step);
                return Ok(choice);
            }
            Err(error) if error.is_damage() => choice.skipped.push(Skipped {
                step: *step,
                path: path.clone(),
                error,
            }),
            Err(error) => {
                return Err(CkptError::CannotResume {
                    step: *step,
                    skipped: skipped_note(&choice.skipped),
                    source: Box::new(error),
                })
            }
        }
    }
    match choice.skipped.first() {
        None => Ok(choice),
        Some(newest) => Err(CkptError::NoneVerifies {
            which: match choice.skipped.len() {
                1 => "the run's one committed checkpoint does not verify".to_string(),
                n => format!("none of the run's {n} committed checkpoints verifies"),
            },
            newest: newest.step,
            why: newest.error.to_string(),
        }),
    }
}

/// " (the newer step-N, step-M are damaged)" for a message, or nothing.
fn skipped_note(skipped: &[Skipped]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let steps: Vec<String> = skipped.iter().map(|s| format!("step-{}", s.step)).collect();
    let verb = if skipped.len() == 1 { "is" } else { "are" };
    format!(" (the newer {} {verb} damaged)", steps.join(", "))
}

/// A resume step that cannot be used (a usage error: the run is not
/// started).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error(
        "cannot resume from step {step}: run '{run}' has no checkpoints (nothing committed in \
         '{dir}'); leave out --resume-from (RunConfig.resume_from) to start from the beginning"
    )]
    NoCheckpoints {
        step: u64,
        run: String,
        dir: Location,
    },
    #[error(
        "cannot resume from step {step}: run '{run}' has no checkpoint step-{step}; \
         its checkpoints are steps {available}"
    )]
    NoSuchStep {
        step: u64,
        run: String,
        available: String,
    },
    #[error("cannot resume from step {step}: checkpoint step-{step} of run '{run}' does not verify: {source}; {others}")]
    Damaged {
        step: u64,
        run: String,
        // Boxed: a usage error stays small, whatever went wrong here.
        source: Box<CkptError>,
        others: String,
    },
    #[error("cannot resume from step {step}: {source}")]
    Unlisted { step: u64, source: Box<CkptError> },
}

fn list(steps: impl Iterator<Item = u64>) -> String {
    steps.map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}

/// Checks, before the run starts, that run `run` (in `run_dir`) has a
/// committed checkpoint `step` and that it verifies.
pub fn check_requested(run_dir: &Location, run: &str, step: u64) -> Result<(), ResumeError> {
    let root = run_dir.join(CHECKPOINTS);
    let all = committed(&root).map_err(|e| ResumeError::Unlisted {
        step,
        source: Box::new(e),
    })?;
    if all.is_empty() {
        return Err(ResumeError::NoCheckpoints {
            step,
            run: run.to_string(),
            dir: root,
        });
    }
    let Some((_, path)) = all.iter().find(|(s, _)| *s == step) else {
        return Err(ResumeError::NoSuchStep {
            step,
            run: run.to_string(),
            available: list(all.iter().map(|(s, _)| *s)),
        });
    };
    verify(path).map(drop).map_err(|source| {
        let others: Vec<u64> = all.iter().map(|(s, _)| *s).filter(|s| *s != step).collect();
        ResumeError::Damaged {
            step,
            run: run.to_string(),
            source: Box::new(source),
            others: if others.is_empty() {
                "it has no other checkpoint".to_string()
            } else {
                format!(
                    "its other checkpoints are steps {}",
                    list(others.into_iter())
                )
            },
        }
    })
}

/// Sets aside every committed checkpoint newer than `step` (renamed
/// `superseded-step-N`, files untouched); with `None`, every one (a run
/// started again from the beginning). Returns (step, old path, new path)
/// of each, oldest first.
pub fn supersede_newer(
    root: &Location,
    step: Option<u64>,
) -> Result<Vec<(u64, Location, Location)>, CkptError> {
    let mut moved = Vec::new();
    for (newer, path) in committed(root)?
        .into_iter()
        .filter(|(s, _)| step.is_none_or(|step| *s > step))
    {
        let to = set_aside(root, newer, SUPERSEDED)?;
        moved.push((newer, path, to));
    }
    Ok(moved)
}

/// The checkpoint a worker of attempt `attempt` uses: the newest one its
/// own attempt committed, else the one the controller chose for the
/// attempt (`chosen`; `None`: none). Checkpoints newer than the chosen one
/// that this attempt did not commit are the ones the controller skipped as
/// damaged, and are never given out.
pub fn for_attempt(
    root: &Location,
    chosen: Option<u64>,
    attempt: u32,
) -> Result<Option<(u64, Location)>, CkptError> {
    for (step, path) in committed(root)?.into_iter().rev() {
        if chosen.is_some_and(|c| step <= c) {
            break;
        }
        if crate::manifest::read(&path).is_ok_and(|m| m.attempt == Some(attempt)) {
            return Ok(Some((step, path)));
        }
    }
    Ok(chosen.map(|step| (step, step_at(root, step))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::{commit, tmp_dir};
    use crate::manifest::{Leaf, Manifest, FORMAT_VERSION};
    use crate::shard::{write_rank_file, ShardIn};
    use bytes::Bytes;
    use std::path::{Path, PathBuf};

    fn loc(p: &Path) -> Location {
        Location::from(p)
    }

    /// Commits step `step` of a one-leaf tree (4 float32 values), saved by
    /// attempt `attempt`.
    fn save(root: &Path, step: u64, attempt: Option<u32>) -> PathBuf {
        let bytes: Vec<u8> = (0..4u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let tmp = tmp_dir(root, step);
        std::fs::create_dir_all(&tmp).unwrap();
        let shards = write_rank_file(
            &tmp,
            0,
            &[ShardIn {
                leaf: "w".into(),
                dtype: "float32".into(),
                region: vec![(0, 4)],
                data: Bytes::from(bytes),
                per_process: false,
            }],
        )
        .unwrap();
        let manifest = Manifest {
            format: FORMAT_VERSION,
            step,
            leaves: vec![Leaf {
                path: "w".into(),
                dtype: "float32".into(),
                shape: vec![4],
                shards: shards.into_iter().map(|(_, s)| s).collect(),
            }],
            files: vec![],
            extra: serde_json::json!({}),
            attempt,
        };
        commit(&loc(root), &manifest)
            .unwrap()
            .local()
            .unwrap()
            .to_path_buf()
    }

    fn flip_last_byte(dir: &Path) {
        let file = dir.join("rank-0.safetensors");
        let mut raw = std::fs::read(&file).unwrap();
        let n = raw.len();
        raw[n - 1] ^= 0x01;
        std::fs::write(&file, raw).unwrap();
    }

    #[test]
    fn choose_takes_the_newest_that_verifies_and_names_the_rest() {
        let c = |s: u64| (s, Location::Local(PathBuf::from(format!("step-{s}"))));
        let bad = |p: &Location| -> Result<(), CkptError> {
            if p.name() == "step-40" || p.name() == "step-30" {
                Err(CkptError::MissingShard(
                    p.as_path().join("rank-0.safetensors"),
                ))
            } else {
                Ok(())
            }
        };
        let choice = choose(&[c(10), c(20), c(30), c(40)], bad).unwrap();
        assert_eq!(choice.step, Some(20));
        let skipped: Vec<u64> = choice.skipped.iter().map(|s| s.step).collect();
        assert_eq!(skipped, vec![40, 30]);
        assert!(choice.skipped[0].error.to_string().contains("step-40"));
        // None verifies: no start from the beginning behind the user's back.
        let err = choose(&[c(30), c(40)], bad).unwrap_err().to_string();
        assert!(
            err.starts_with("none of the run's 2 committed checkpoints verifies")
                && err.contains("the newest, step-40: shard file")
                && err.contains("--resume-from none"),
            "{err}"
        );
        // Nothing committed: from the beginning, nothing skipped.
        let choice = choose(&[], bad).unwrap();
        assert_eq!((choice.step, choice.skipped.len()), (None, 0));
    }

    #[test]
    fn only_damage_is_passed_over() {
        let c = |s: u64| (s, Location::Local(PathBuf::from(format!("step-{s}"))));
        // Step 30 is whole but was committed without all of a leaf: the
        // choice stops there, naming it, and does not fall back to step 20.
        let verdict = |p: &Location| -> Result<(), CkptError> {
            match p.name().as_str() {
                "step-40" => Err(CkptError::MissingShard(
                    p.as_path().join("rank-0.safetensors"),
                )),
                "step-30" => Err(CkptError::Uncovered {
                    leaf: "w".into(),
                    copy: String::new(),
                    how: "the manifest's shards overlap".into(),
                }),
                _ => Ok(()),
            }
        };
        let err = choose(&[c(20), c(30), c(40)], verdict)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("checkpoint step-30 cannot be resumed from (the newer step-40 is damaged): leaf 'w'"),
            "{err}"
        );
        assert!(err.contains("its bytes are intact"), "{err}");
    }

    #[test]
    fn a_damaged_newest_is_skipped_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        save(root, 10, None);
        let newest = save(root, 20, None);
        flip_last_byte(&newest);
        let before = std::fs::read(newest.join("rank-0.safetensors")).unwrap();
        let choice = newest_verified(&loc(root)).unwrap();
        assert_eq!(choice.step, Some(10));
        assert_eq!(choice.skipped.len(), 1);
        let why = choice.skipped[0].error.to_string();
        assert!(
            why.contains("checksum mismatch") && why.contains("rank-0.safetensors"),
            "{why}"
        );
        assert_eq!(
            std::fs::read(newest.join("rank-0.safetensors")).unwrap(),
            before
        );
        // A missing shard file and a manifest that is not JSON are caught too.
        std::fs::write(newest.join("manifest.json"), "{not json").unwrap();
        assert!(newest_verified(&loc(root)).unwrap().skipped[0]
            .error
            .to_string()
            .contains("manifest"));
        std::fs::remove_file(root.join("step-10/rank-0.safetensors")).unwrap();
        let err = newest_verified(&loc(root)).unwrap_err().to_string();
        assert!(
            err.contains("none of the run's 2 committed checkpoints verifies"),
            "{err}"
        );
    }

    #[test]
    fn a_manifest_that_disagrees_with_its_files_does_not_verify() {
        let dir = tempfile::tempdir().unwrap();
        let path = save(dir.path(), 5, None);
        let mut m = crate::manifest::read(&loc(&path)).unwrap();
        m.leaves[0].shape = vec![8];
        m.leaves[0].shards[0].region = vec![(0, 8)];
        std::fs::write(
            path.join("manifest.json"),
            serde_json::to_string(&m).unwrap(),
        )
        .unwrap();
        let err = verify(&loc(&path)).unwrap_err().to_string();
        assert!(err.contains("has 16 bytes, expected 32"), "{err}");
        m.leaves[0].shards[0].region = vec![(0, 4)];
        std::fs::write(
            path.join("manifest.json"),
            serde_json::to_string(&m).unwrap(),
        )
        .unwrap();
        let err = verify(&loc(&path)).unwrap_err();
        assert!(!err.is_damage());
        let err = err.to_string();
        assert!(err.contains("cover only 4 of its 8 elements"), "{err}");
    }

    #[test]
    fn a_requested_step_must_exist_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let err = check_requested(&loc(run), "r", 3).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot resume from step 3: run 'r' has no checkpoints"),
            "{err}"
        );
        let root = run.join(CHECKPOINTS);
        save(&root, 1, None);
        save(&root, 2, None);
        let three = save(&root, 3, None);
        check_requested(&loc(run), "r", 2).unwrap();
        let err = check_requested(&loc(run), "r", 999)
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("has no checkpoint step-999; its checkpoints are steps 1, 2, 3"),
            "{err}"
        );
        flip_last_byte(&three);
        let err = check_requested(&loc(run), "r", 3).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint step-3 of run 'r' does not verify: checksum mismatch"),
            "{err}"
        );
        assert!(
            err.ends_with("; its other checkpoints are steps 1, 2"),
            "{err}"
        );
    }

    #[test]
    fn newer_checkpoints_are_set_aside_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for step in [1, 2, 3] {
            save(root, step, None);
        }
        let bytes = std::fs::read(root.join("step-3/rank-0.safetensors")).unwrap();
        // A name already taken (set aside before) gets a suffix.
        std::fs::create_dir(root.join("superseded-step-3")).unwrap();
        let moved = supersede_newer(&loc(root), Some(1)).unwrap();
        let names: Vec<(u64, String)> = moved.iter().map(|(s, _, to)| (*s, to.name())).collect();
        assert_eq!(
            names,
            vec![
                (2, "superseded-step-2".into()),
                (3, "superseded-step-3.2".into())
            ]
        );
        assert_eq!(
            std::fs::read(root.join("superseded-step-3.2/rank-0.safetensors")).unwrap(),
            bytes
        );
        let left: Vec<u64> = committed(&loc(root))
            .unwrap()
            .iter()
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(left, vec![1]);
        assert_eq!(newest_verified(&loc(root)).unwrap().step, Some(1));
    }

    #[test]
    fn a_worker_gets_the_chosen_step_or_what_its_attempt_committed_since() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        save(root, 10, Some(1));
        save(root, 20, Some(1));
        let damaged = save(root, 30, Some(1));
        flip_last_byte(&damaged);
        // Attempt 2 was told to resume from 20: step-30 is not its own.
        assert_eq!(
            for_attempt(&loc(root), Some(20), 2).unwrap(),
            Some((20, loc(&root.join("step-20"))))
        );
        assert_eq!(for_attempt(&loc(root), None, 2).unwrap(), None);
        // Once attempt 2 commits 25, then 30 again, those are its newest.
        save(root, 25, Some(2));
        assert_eq!(for_attempt(&loc(root), Some(20), 2).unwrap().unwrap().0, 25);
        save(root, 30, Some(2));
        assert_eq!(for_attempt(&loc(root), Some(20), 2).unwrap().unwrap().0, 30);
        assert_eq!(for_attempt(&loc(root), None, 2).unwrap().unwrap().0, 30);
    }
}
