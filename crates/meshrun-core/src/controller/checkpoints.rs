//! The controller's part of checkpointing: choose the checkpoint each
//! attempt resumes from, gather the ranks' parts of each step (see
//! [`super::gather`]), and when a step is complete, commit it (write the
//! manifest, rename `tmp-<step>` to `step-<step>`). Uncommitted folders
//! left by a crash are removed when a run (re)starts.

use meshrun_ckpt::commit::{clean_uncommitted, committed, delete, set_aside, step_at};
use meshrun_ckpt::directory::FileRecord;
use meshrun_ckpt::manifest::{Leaf, Manifest, FORMAT_VERSION};
use meshrun_ckpt::resume::{
    newest_verified, supersede_newer, verify, Skipped, CHECKPOINTS, DAMAGED,
};
use meshrun_ckpt::store::Location;
use meshrun_ckpt::CkptError;
use meshrun_plan::retention::{to_delete, Candidate, Retention};
use meshrun_plan::ResumeFrom;
use meshrun_record::Event;

use super::committer::CommitJob;
use super::terminal::terminal;
use crate::error::CoreError;
use crate::rundir::RunDir;
pub use meshrun_machine::gather::Part;
use meshrun_machine::gather::{Decided, Gather};

/// What a rank's part or report settled: a step to commit (off the
/// driver's loop, see [`super::committer`]), or one refused at once.
#[derive(Debug)]
pub enum Settled {
    Commit(CommitJob),
    /// It cannot be committed, for a reason the user must fix.
    Refused {
        step: u64,
        rank: u32,
        error: String,
    },
}

/// Retention's rules and what they apply to, for the committer's thread.
#[derive(Debug)]
pub struct RetainJob {
    root: Location,
    policy: Retention,
    /// Damaged checkpoints (on a local disk) are not the run's to count or
    /// delete.
    skipped: Vec<u64>,
}

/// What became of a step the ranks' parts completed.
#[derive(Debug)]
pub enum Done {
    Committed { step: u64, path: Location },
    Failed { step: u64, error: CkptError },
}

pub struct Checkpoints {
    root: Location,
    retention: Option<Retention>,
    gather: Gather,
    attempt: u32,
    /// The step this attempt resumes from.
    resume: Option<u64>,
    /// Whether the user asked for it (a step, or the beginning; else: the
    /// newest that verifies).
    requested: bool,
    /// Newer checkpoints that did not verify when the attempt opened. They
    /// stay where they are; retention neither counts nor deletes them, and
    /// if their step is committed again they are set aside, not replaced.
    skipped: Vec<Skipped>,
    /// With a requested step: the newer checkpoints set aside, (step, old
    /// path, new path).
    superseded: Vec<(u64, Location, Location)>,
    /// In an object store, the damaged checkpoints set aside when the
    /// attempt opened: (step, old place, new place).
    damaged: Vec<(u64, Location, Location)>,
}

impl Checkpoints {
    /// Opens `run_dir/checkpoints` for attempt `attempt`: removes
    /// uncommitted folders (returned, for the record) and chooses the
    /// checkpoint to resume from: `requested` (the first attempt of a run
    /// given `--resume-from`; the newer ones are set aside, all of them for
    /// `none`), else the newest that verifies (an error when checkpoints
    /// exist and none can be resumed from: see `newest_verified`). Verifying reads every byte once; the restore
    /// that follows finds them in the page cache. In an object store, where
    /// ranks write into the step's own folder, a damaged checkpoint is set
    /// aside at once rather than when its step is saved again.
    pub fn open(
        run_dir: &Location,
        world: u32,
        retention: Option<Retention>,
        attempt: u32,
        requested: Option<ResumeFrom>,
    ) -> Result<(Self, Vec<Location>), CkptError> {
        let root = run_dir.join(CHECKPOINTS);
        if let Some(dir) = root.local() {
            std::fs::create_dir_all(dir).map_err(CkptError::io("cannot create", dir))?;
        }
        let removed = clean_uncommitted(&root)?;
        let mut me = Self {
            root,
            retention,
            gather: Gather::new(world),
            attempt,
            resume: None,
            requested: requested.is_some(),
            skipped: Vec::new(),
            superseded: Vec::new(),
            damaged: Vec::new(),
        };
        if let Some(from) = requested {
            // Checked before the run started; checked again, since this is
            // what the workers will restore.
            if let Some(step) = from.step() {
                verify(&step_at(&me.root, step))?;
            }
            me.superseded = supersede_newer(&me.root, from.step())?;
            me.resume = from.step();
        } else {
            let choice = newest_verified(&me.root)?;
            me.resume = choice.step;
            me.skipped = choice.skipped;
            if me.root.is_remote() {
                for s in std::mem::take(&mut me.skipped) {
                    let to = set_aside(&me.root, s.step, DAMAGED)?;
                    me.damaged.push((s.step, s.path.clone(), to));
                    me.skipped.push(s);
                }
            }
        }
        Ok((me, removed))
    }

    /// An elastic attempt runs on `world` ranks: a step is complete when
    /// that many wrote their parts (said before any did).
    pub fn set_world(&mut self, world: u32) {
        self.gather = Gather::new(world);
    }

    /// The step the workers of this attempt resume from.
    pub fn resume_step(&self) -> Option<u64> {
        self.resume
    }

    /// Records the choice in `events.jsonl` and says on stderr what was
    /// skipped or set aside, and why.
    pub fn record(&self, rundir: &mut RunDir) -> Result<(), CoreError> {
        let from = self.resume.map_or_else(
            || "starting from the beginning".to_string(),
            |s| format!("resuming from step-{s}"),
        );
        for s in &self.skipped {
            rundir.event(Event::CheckpointSkipped {
                attempt: self.attempt,
                step: s.step,
                path: s.path.to_string(),
                reason: s.error.to_string(),
                resume_step: self.resume,
            })?;
            terminal().note(&format!(
                "meshrun: checkpoint step-{} skipped: {}; {from}",
                s.step, s.error
            ));
        }
        for (step, path, to) in &self.superseded {
            let why = self.resume.map_or_else(
                || "the run was started from the beginning (--resume-from none)".to_string(),
                |s| format!("newer than the step asked to resume from ({s})"),
            );
            rundir.event(Event::CheckpointSetAside {
                attempt: self.attempt,
                step: *step,
                path: path.to_string(),
                moved_to: to.to_string(),
                reason: why.clone(),
            })?;
            terminal().note(&format!(
                "meshrun: checkpoint step-{step} set aside as '{to}': {why}"
            ));
        }
        for (step, path, to) in &self.damaged {
            let why = "it does not verify".to_string();
            rundir.event(Event::CheckpointSetAside {
                attempt: self.attempt,
                step: *step,
                path: path.to_string(),
                moved_to: to.to_string(),
                reason: why.clone(),
            })?;
            terminal().note(&format!(
                "meshrun: damaged checkpoint step-{step} set aside as '{to}', so that step {step} saved again does not replace it"
            ));
        }
        if let Some(step) = self.resume {
            rundir.event(Event::Resuming {
                attempt: self.attempt,
                step,
                requested: self.requested,
            })?;
        }
        Ok(())
    }

    /// Records one rank's part of `step`; gives what that completes.
    pub fn written(
        &mut self,
        rank: u32,
        step: u64,
        part: Part,
        extra: Option<serde_json::Value>,
    ) -> Vec<Settled> {
        let decided = self.gather.written(rank, step, part, extra);
        self.settle(decided)
    }

    /// Records one rank's report of `step`; gives what that completes (a
    /// folder from another rank waits for every rank's report).
    pub fn reported(&mut self, rank: u32, step: u64, passed: bool, saving: bool) -> Vec<Settled> {
        let decided = self.gather.reported(rank, step, passed, saving);
        self.settle(decided)
    }

    /// A rank's save of `step` failed: the step is never committed.
    pub fn abandon(&mut self, step: u64) {
        self.gather.abandon(step);
    }

    fn settle(&mut self, decided: Vec<Decided>) -> Vec<Settled> {
        decided
            .into_iter()
            .filter_map(|d| match d {
                Decided::Complete {
                    step,
                    leaves,
                    files,
                    extra,
                } => Some(Settled::Commit(self.commit_job(step, leaves, files, extra))),
                Decided::Refused { step, rank, error } => {
                    Some(Settled::Refused { step, rank, error })
                }
                Decided::Dropped { .. } => None,
            })
            .collect()
    }

    fn commit_job(
        &mut self,
        step: u64,
        leaves: Vec<Leaf>,
        files: Vec<FileRecord>,
        extra: Option<serde_json::Value>,
    ) -> CommitJob {
        let manifest = Manifest {
            format: FORMAT_VERSION,
            step,
            leaves,
            files,
            extra: extra.unwrap_or(serde_json::Value::Null),
            attempt: Some(self.attempt),
        };
        let local = !self.root.is_remote();
        let damaged = self.skipped.iter().position(|s| local && s.step == step);
        // Set aside once: the committer does it before this commit.
        if let Some(i) = damaged {
            self.skipped.remove(i);
        }
        CommitJob {
            root: self.root.clone(),
            manifest,
            set_aside_damaged: damaged.is_some(),
        }
    }

    /// What retention needs, when the run has rules.
    pub fn retain_job(&self) -> Option<RetainJob> {
        Some(RetainJob {
            root: self.root.clone(),
            policy: self.retention.clone()?,
            skipped: if self.root.is_remote() {
                Vec::new()
            } else {
                self.skipped.iter().map(|s| s.step).collect()
            },
        })
    }
}

/// Applies the retention rules to the committed checkpoints; gives the
/// steps deleted.
pub fn retain(job: &RetainJob) -> Result<Vec<u64>, CkptError> {
    let policy = &job.policy;
    let all: Vec<(u64, Location)> = committed(&job.root)?
        .into_iter()
        .filter(|(step, _)| !job.skipped.contains(step))
        .collect();
    let candidates: Vec<Candidate> = all
        .iter()
        .map(|(step, path)| Candidate {
            step: *step,
            score: policy.score_attribute.as_ref().and_then(|attr| {
                meshrun_ckpt::manifest::read(path)
                    .ok()?
                    .extra
                    .get("metrics")?
                    .get(attr)?
                    .as_f64()
            }),
        })
        .collect();
    let doomed = to_delete(policy, &candidates);
    for (step, path) in &all {
        if doomed.contains(step) {
            delete(path)?;
        }
    }
    Ok(doomed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshrun_ckpt::commit::tmp_dir;
    use meshrun_ckpt::shard::{write_rank_file, ShardIn};
    use meshrun_plan::retention::ScoreOrder;
    use std::path::{Path, PathBuf};

    fn loc(p: &Path) -> Location {
        Location::from(p)
    }

    /// Writes one rank's file of step `step` (4 float32 values), as a
    /// worker does; returns its leaves for `written`.
    fn shards(run_dir: &Path, step: u64) -> Vec<Leaf> {
        let bytes: Vec<u8> = (0..4u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let dir = tmp_dir(&run_dir.join(CHECKPOINTS), step);
        std::fs::create_dir_all(&dir).unwrap();
        let input = ShardIn {
            leaf: "w".into(),
            dtype: "float32".into(),
            region: vec![(0, 4)],
            data: bytes::Bytes::from(bytes),
            per_process: false,
        };
        let records = write_rank_file(&dir, 0, &[input]).unwrap();
        vec![Leaf {
            path: "w".into(),
            dtype: "float32".into(),
            shape: vec![4],
            shards: records.into_iter().map(|(_, r)| r).collect(),
        }]
    }

    fn steps(run_dir: &Path) -> Vec<u64> {
        committed(&loc(&run_dir.join(CHECKPOINTS)))
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    /// Runs the commits `settled` asks for, here and now.
    fn done(settled: Vec<Settled>) -> Vec<Done> {
        settled
            .into_iter()
            .map(|s| match s {
                Settled::Commit(job) => job.run(),
                Settled::Refused { error, .. } => panic!("refused: {error}"),
            })
            .collect()
    }

    fn shard_file(run_dir: &Path, folder: &str) -> PathBuf {
        run_dir
            .join(CHECKPOINTS)
            .join(folder)
            .join("rank-0.safetensors")
    }

    #[test]
    fn a_damaged_checkpoint_is_skipped_kept_out_of_retention_and_set_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let (mut first, _) = Checkpoints::open(&loc(run), 1, None, 1, None).unwrap();
        assert_eq!(first.resume_step(), None);
        for step in [10, 20, 30] {
            assert!(matches!(
                done(first.written(0, step, Part::Shards(shards(run, step)), None))[..],
                [Done::Committed { .. }]
            ));
        }
        let file = shard_file(run, "step-30");
        let mut raw = std::fs::read(&file).unwrap();
        *raw.last_mut().unwrap() ^= 1;
        std::fs::write(&file, &raw).unwrap();

        let keep_one = Retention {
            num_to_keep: Some(1),
            keep_every_n_steps: None,
            score_attribute: None,
            score_order: ScoreOrder::Max,
        };
        let (mut second, _) = Checkpoints::open(&loc(run), 1, Some(keep_one), 2, None).unwrap();
        assert_eq!(second.resume_step(), Some(20));
        assert_eq!(second.skipped.len(), 1);
        // Counted, the damaged step 30 would be "the newest" and the good
        // ones would all go.
        done(second.written(0, 25, Part::Shards(shards(run, 25)), None));
        assert_eq!(retain(&second.retain_job().unwrap()).unwrap(), vec![10, 20]);
        assert_eq!(steps(run), vec![25, 30]);
        // Step 30 saved again: the damaged copy is set aside, as it was.
        done(second.written(0, 30, Part::Shards(shards(run, 30)), None));
        assert_eq!(
            std::fs::read(shard_file(run, "damaged-step-30")).unwrap(),
            raw
        );
        verify(&loc(&run.join(CHECKPOINTS).join("step-30"))).unwrap();
        assert_eq!(
            meshrun_ckpt::manifest::read(&loc(&run.join(CHECKPOINTS).join("step-30")))
                .unwrap()
                .attempt,
            Some(2)
        );
        assert_eq!(retain(&second.retain_job().unwrap()).unwrap(), vec![25]);
        assert_eq!(steps(run), vec![30]);
    }

    #[test]
    fn a_requested_step_sets_the_newer_ones_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let (mut first, _) = Checkpoints::open(&loc(run), 1, None, 1, None).unwrap();
        for step in [1, 2, 3] {
            done(first.written(0, step, Part::Shards(shards(run, step)), None));
        }
        let (second, _) =
            Checkpoints::open(&loc(run), 1, None, 2, Some(ResumeFrom::Step(1))).unwrap();
        assert_eq!(second.resume_step(), Some(1));
        let moved: Vec<u64> = second.superseded.iter().map(|(s, _, _)| *s).collect();
        assert_eq!(moved, vec![2, 3]);
        assert_eq!(steps(run), vec![1]);
        assert!(shard_file(run, "superseded-step-3").exists());
        // A step that is not there (any more) fails the attempt.
        assert!(Checkpoints::open(&loc(run), 1, None, 3, Some(ResumeFrom::Step(3))).is_err());
    }
}
