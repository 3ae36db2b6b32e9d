//! The ranks' calls of programs that span every process, compared as they
//! come: JAX's rule is that every process runs the same such programs in
//! the same order with the same global shapes, and a rank that breaks it
//! hangs in a collective the others never enter (or, with shapes that
//! still fit, computes the wrong thing). Each rank numbers its calls; the
//! n-th call of every rank must be of the same program. A rank whose n-th
//! call differs from another's, or that makes an n-th call after another
//! rank finished its program with fewer, is named at once, with what each
//! ran, instead of waiting for the hang timeout.
//!
//! Only ranks whose recorder is on take part (a rank says so with a call
//! numbered 0): a rank under a JAX whose hooks meshrun cannot place counts
//! nothing, and must not read as a rank that made no call.
//!
//! Kept here too, per rank, are its last calls: a hang's summary says
//! which call each rank is in and which ranks have not arrived.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;

use meshrun_record::program::Program;

/// How many calls of each rank are kept for a hang's summary.
const KEPT_CALLS: usize = 8;
/// Calls not yet made by every rank that are kept for comparison: the
/// ranks of one program keep within a few calls of each other (a
/// collective holds the fastest back), so this is only a bound on memory.
const OPEN_CALLS: usize = 4096;

/// One call, as a rank sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub n: u64,
    pub fingerprint: String,
    pub site: String,
}

/// A call not yet made by every rank: the first rank's, and how many
/// ranks have made it.
struct Open {
    call: Call,
    rank: u32,
    count: usize,
}

/// Two ranks whose programs parted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parted {
    /// The rank whose call shows it (the later of the two to call).
    pub rank: u32,
    pub other: u32,
    pub call: u64,
    pub detail: String,
}

#[derive(Default)]
pub(crate) struct Programs {
    /// What each program is, by fingerprint, as the first rank described it.
    known: HashMap<String, Program>,
    /// The rank that first described each program.
    described_by: HashMap<String, u32>,
    /// Per rank, its last calls, newest last.
    calls: Vec<VecDeque<Call>>,
    /// Per rank that finished its program: how many calls it made.
    finished: Vec<Option<u64>>,
    /// Per rank: whether its recorder is on.
    recording: Vec<bool>,
    open: BTreeMap<u64, Open>,
    parted: bool,
}

impl Programs {
    pub fn new(nranks: usize) -> Self {
        Self {
            calls: vec![VecDeque::new(); nranks],
            finished: vec![None; nranks],
            recording: vec![false; nranks],
            ..Self::default()
        }
    }

    /// Whether any rank has called a program across processes.
    pub fn any(&self) -> bool {
        self.calls.iter().any(|c| !c.is_empty())
    }

    /// Whether a rank has described the program of this fingerprint.
    pub fn knows(&self, fingerprint: &str) -> bool {
        self.known.contains_key(fingerprint)
    }

    /// Rank `rank` described a program. The same program (the same
    /// `StableHLO`) that XLA optimized into other collectives on another
    /// rank (an autotuning that chose differently, a flag set on one host)
    /// parts them as surely as another program.
    pub fn program(&mut self, rank: u32, program: Program) -> Option<Parted> {
        let Some(first) = self.known.get(&program.fingerprint) else {
            self.described_by.insert(program.fingerprint.clone(), rank);
            self.known.insert(program.fingerprint.clone(), program);
            return None;
        };
        if first.collectives == program.collectives || self.parted {
            return None;
        }
        self.parted = true;
        let other = self.described_by[&program.fingerprint];
        let i = first
            .collectives
            .iter()
            .zip(&program.collectives)
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| first.collectives.len().min(program.collectives.len()));
        let said = |c: &Vec<String>| c.get(i).cloned().unwrap_or_else(|| "none".into());
        Some(Parted {
            rank,
            other,
            call: 0,
            detail: format!(
                "compiled {} at {} into other collectives than rank {other} did from the same \
                 program: collective #{} is {} here and {} there; XLA must compile a program \
                 across processes the same way on every process (the same JAX, jaxlib and \
                 XLA flags on every host)",
                program.name,
                program.site,
                i + 1,
                said(&program.collectives),
                said(&first.collectives)
            ),
        })
    }

    /// Rank `rank` made `call` (numbered 0: its recorder is on); what
    /// parted, if this shows it.
    pub fn call(&mut self, rank: u32, call: Call) -> Option<Parted> {
        let recording = self.recording.get_mut(rank as usize)?;
        *recording = true;
        if call.n == 0 {
            return None;
        }
        let kept = &mut self.calls[rank as usize];
        if kept.len() == KEPT_CALLS {
            kept.pop_front();
        }
        kept.push_back(call.clone());
        if self.parted {
            return None;
        }
        let finished_before = self
            .finished
            .iter()
            .enumerate()
            .find(|(_, f)| f.is_some_and(|made| made < call.n));
        if let Some((other, made)) = finished_before {
            return Some(self.after_finish(rank, &call, other as u32, made.unwrap_or(0)));
        }
        let nranks = self.calls.len();
        match self.open.get_mut(&call.n) {
            Some(open) if open.call.fingerprint != call.fingerprint => {
                let (other, theirs) = (open.rank, open.call.clone());
                return Some(self.differs(rank, &call, other, &theirs));
            }
            Some(open) => {
                open.count += 1;
                if open.count >= nranks {
                    self.open.remove(&call.n);
                    // A check of values is made once: its description
                    // (a line per leaf) is not kept past it.
                    if self
                        .known
                        .get(&call.fingerprint)
                        .is_some_and(Program::is_values)
                    {
                        self.known.remove(&call.fingerprint);
                        self.described_by.remove(&call.fingerprint);
                    }
                }
            }
            None if nranks > 1 => {
                if self.open.len() == OPEN_CALLS {
                    self.open.pop_first();
                }
                self.open.insert(
                    call.n,
                    Open {
                        call,
                        rank,
                        count: 1,
                    },
                );
            }
            None => {}
        }
        None
    }

    /// Rank `rank` finished its program: a rank that has made a call it
    /// never made waits for it forever.
    pub fn finished(&mut self, rank: u32) -> Option<Parted> {
        if !*self.recording.get(rank as usize)? {
            return None;
        }
        let made = self.calls[rank as usize].back().map_or(0, |c| c.n);
        self.finished[rank as usize] = Some(made);
        if self.parted {
            return None;
        }
        let beyond = self
            .calls
            .iter()
            .enumerate()
            .filter(|(r, _)| self.finished[*r].is_none())
            .find_map(|(r, calls)| {
                let call = calls.iter().find(|c| c.n == made + 1)?;
                Some((r as u32, call.clone()))
            });
        let (waiting, call) = beyond?;
        Some(self.after_finish(waiting, &call, rank, made))
    }

    /// A line per call number that ranks are last in: which call each rank
    /// is in, and which have not arrived. Empty when no rank has called a
    /// program across processes.
    pub fn wavefront(&self) -> String {
        let mut at: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (rank, calls) in self.calls.iter().enumerate() {
            let n = calls.back().map_or(0, |c| c.n);
            at.entry(n).or_default().push(rank as u32);
        }
        if at.len() <= 1 && !self.any() {
            return String::new();
        }
        let parts: Vec<String> = at
            .iter()
            .rev()
            .map(|(n, ranks)| {
                let who = ranks_text(ranks);
                if *n == 0 {
                    return format!("{who}: no call yet");
                }
                let rank = ranks[0] as usize;
                let call = self.calls[rank].back().expect("n > 0");
                format!("{who}: in call {n}, {}", self.said(call))
            })
            .collect();
        format!("calls across processes, newest first: {}", parts.join("; "))
    }

    /// The flight recorder's dump: each rank's last calls, then what each
    /// program called is.
    pub fn dump(&self) -> String {
        let mut text = String::from("# each rank's last calls of programs across processes\n");
        for (rank, calls) in self.calls.iter().enumerate() {
            let said: Vec<String> = calls
                .iter()
                .map(|c| format!("{} {}", c.n, self.said(c)))
                .collect();
            let said = if said.is_empty() {
                "none".to_string()
            } else {
                said.join("; ")
            };
            let _ = writeln!(text, "rank {rank}: {said}");
        }
        text.push_str("\n# the programs\n");
        let mut known: Vec<&Program> = self.known.values().collect();
        known.sort_by(|a, b| (&a.name, &a.fingerprint).cmp(&(&b.name, &b.fingerprint)));
        for p in known {
            let _ = writeln!(
                text,
                "{} {} at {}: ({}), {} lines, collectives: {}",
                &p.fingerprint[..p.fingerprint.len().min(12)],
                p.name,
                p.site,
                p.args,
                p.size,
                p.collectives.join(", ")
            );
        }
        text
    }

    fn said(&self, call: &Call) -> String {
        let name = self
            .known
            .get(&call.fingerprint)
            .map_or("a program", |p| p.name.as_str());
        if call.site.is_empty() {
            name.to_string()
        } else {
            format!("{name} at {}", call.site)
        }
    }

    fn differs(&mut self, rank: u32, call: &Call, other: u32, theirs: &Call) -> Parted {
        self.parted = true;
        let (mine, their) = (
            self.known.get(&call.fingerprint),
            self.known.get(&theirs.fingerprint),
        );
        let detail = match (mine, their) {
            (Some(m), Some(t)) if m.is_values() && t.is_values() => format!(
                "holds other values than rank {other} in what is replicated over every process \
                 ({} at {}): {}; such a value must be the same on each process (made from the \
                 same seed, or sent from one)",
                m.name,
                m.site,
                m.difference(t)
            ),
            _ => format!(
                "ran {} as its call {} across processes, where rank {other} ran {}: {}; every \
                 process must run the same programs across processes, in the same order, with \
                 the same global shapes",
                self.said(call),
                call.n,
                self.said(theirs),
                match (mine, their) {
                    (Some(m), Some(t)) => m.difference(t),
                    _ => "the programs differ".to_string(),
                }
            ),
        };
        Parted {
            rank,
            other,
            call: call.n,
            detail,
        }
    }

    fn after_finish(&mut self, rank: u32, call: &Call, other: u32, made: u64) -> Parted {
        self.parted = true;
        Parted {
            rank,
            other,
            call: call.n,
            detail: format!(
                "waits in {} (its call {} across processes) for rank {other}, which finished \
                 its program after {made} such calls; every process must run the same programs \
                 across processes, in the same order, with the same global shapes",
                self.said(call),
                call.n
            ),
        }
    }
}

/// "ranks 0-2, 5", "rank 3".
fn ranks_text(ranks: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let text: Vec<String> = runs
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{noun} {}", text.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(fp: &str, name: &str, args: &str) -> Program {
        Program {
            fingerprint: fp.into(),
            name: name.into(),
            args: args.into(),
            size: 10,
            collectives: vec!["all-reduce f32[]".into()],
            site: String::new(),
            values: Vec::new(),
        }
    }

    fn call(n: u64, fp: &str) -> Call {
        Call {
            n,
            fingerprint: fp.into(),
            site: "train.py:7".into(),
        }
    }

    #[test]
    fn the_same_calls_in_the_same_order_pass() {
        let mut p = Programs::new(3);
        p.program(0, program("a", "jit_step", "f32[8]"));
        for n in 1..=100 {
            for rank in [2, 0, 1] {
                assert_eq!(p.call(rank, call(n, "a")), None);
            }
        }
        assert!(p.open.is_empty(), "calls made by every rank are forgotten");
        for rank in 0..3 {
            assert_eq!(p.finished(rank), None);
        }
    }

    #[test]
    fn another_program_at_the_same_call_is_named_with_what_differs() {
        let mut p = Programs::new(2);
        p.program(0, program("a", "jit_step", "f32[16,4]"));
        p.program(1, program("b", "jit_step", "f32[14,4]"));
        assert_eq!(p.call(0, call(1, "a")), None);
        let parted = p.call(1, call(1, "b")).expect("parted");
        assert_eq!((parted.rank, parted.other, parted.call), (1, 0, 1));
        assert_eq!(
            parted.detail,
            "ran jit_step at train.py:7 as its call 1 across processes, where rank 0 ran \
             jit_step at train.py:7: jit_step with other arguments (f32[14,4] against \
             f32[16,4]); every process must run the same programs across processes, in the \
             same order, with the same global shapes"
        );
        // Said once.
        assert_eq!(p.call(0, call(2, "b")), None);
    }

    #[test]
    fn a_call_that_a_finished_rank_never_made_is_named_whichever_comes_first() {
        // The finish after the call.
        let mut p = Programs::new(2);
        p.program(0, program("a", "jit_step", "f32[8]"));
        for n in 1..=3 {
            p.call(0, call(n, "a"));
        }
        p.call(1, call(1, "a"));
        p.call(1, call(2, "a"));
        let parted = p.finished(1).expect("parted");
        assert_eq!((parted.rank, parted.other, parted.call), (0, 1, 3));
        assert_eq!(
            parted.detail,
            "waits in jit_step at train.py:7 (its call 3 across processes) for rank 1, which \
             finished its program after 2 such calls; every process must run the same programs \
             across processes, in the same order, with the same global shapes"
        );
        // The call after the finish; a rank that made no call at all.
        let mut p = Programs::new(2);
        p.call(1, call(0, ""));
        assert_eq!(p.finished(1), None);
        let parted = p.call(0, call(1, "a")).expect("parted");
        assert_eq!((parted.rank, parted.other, parted.call), (0, 1, 1));
        assert!(parted
            .detail
            .contains("finished its program after 0 such calls;"));
    }

    #[test]
    fn a_rank_whose_recorder_is_off_is_not_compared() {
        let mut p = Programs::new(2);
        p.call(0, call(0, ""));
        // Rank 1's JAX has no hooks: it never says its recorder is on.
        assert_eq!(p.finished(1), None);
        assert_eq!(p.call(0, call(1, "a")), None);
    }

    #[test]
    fn the_wavefront_says_where_each_rank_is() {
        let mut p = Programs::new(4);
        assert_eq!(p.wavefront(), "");
        p.program(0, program("a", "jit_step", "f32[8]"));
        for rank in 0..4 {
            p.call(rank, call(1, "a"));
        }
        for rank in [0, 1, 3] {
            p.call(rank, call(2, "a"));
        }
        assert_eq!(
            p.wavefront(),
            "calls across processes, newest first: ranks 0-1, 3: in call 2, jit_step at \
             train.py:7; rank 2: in call 1, jit_step at train.py:7"
        );
    }

    #[test]
    fn the_same_program_optimized_into_other_collectives_is_named() {
        let mut p = Programs::new(2);
        assert_eq!(p.program(0, program("a", "jit_step", "f32[8]")), None);
        // Rank 1 described the same program the same way: nothing said.
        assert_eq!(p.program(1, program("a", "jit_step", "f32[8]")), None);
        let mut other = program("a", "jit_step", "f32[8]");
        other.collectives = vec!["all-gather f32[8]".into()];
        let parted = p.program(1, other).expect("parted");
        assert_eq!((parted.rank, parted.other), (1, 0));
        assert!(
            parted
                .detail
                .contains("collective #1 is all-gather f32[8] here and all-reduce f32[] there"),
            "{}",
            parted.detail
        );
    }

    #[test]
    fn a_check_of_values_is_forgotten_once_every_rank_made_it() {
        let mut p = Programs::new(2);
        let mut values = program("v", "the replicated values of the state at step 0", "");
        values.values = vec!["w 1234abcd".into()];
        for rank in 0..2 {
            p.program(rank, values.clone());
            assert_eq!(p.call(rank, call(1, "v")), None);
        }
        assert!(!p.knows("v"));
    }

    #[test]
    fn memory_is_bounded_when_a_rank_never_calls() {
        let mut p = Programs::new(2);
        for n in 1..=(OPEN_CALLS as u64 + 10) {
            p.call(0, call(n, "a"));
        }
        assert_eq!(p.open.len(), OPEN_CALLS);
        assert_eq!(p.calls[0].len(), KEPT_CALLS);
    }
}
