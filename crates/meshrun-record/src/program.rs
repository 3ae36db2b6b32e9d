//! The programs a rank runs across every process, as its flight recorder
//! describes them (see `meshrun._recorder`): what the controller compares
//! between ranks, and what a failure's summary quotes.

use serde::{Deserialize, Serialize};

/// A compiled program whose devices are on every process of the attempt
/// and which communicates between them (its optimized form holds a
/// collective): every rank must run such programs in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    /// The program's fingerprint: a hash of its `StableHLO` text without
    /// source locations (the same on every rank for the same program).
    pub fingerprint: String,
    /// Its name as JAX gave it (`jit_train_step`).
    pub name: String,
    /// Its arguments' global shapes, dtypes and shardings, in one line.
    pub args: String,
    /// Lines of its `StableHLO` text.
    pub size: u64,
    /// The collectives of its optimized form, in order ("all-reduce
    /// f32[4]"), the first 64.
    #[serde(default)]
    pub collectives: Vec<String>,
    /// The program's Python line that compiled it ("train.py:41").
    #[serde(default)]
    pub site: String,
    /// For a check of replicated values rather than a program: each
    /// replicated leaf's path and the checksum of this rank's copy
    /// ("params/w 1a2b3c4d"), in the state's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl Program {
    /// What differs between this program and `other`, worded for a
    /// summary: their names, their arguments, their sizes, their first
    /// differing collective, or, where all of that agrees, their
    /// fingerprints.
    /// Whether this is a check of replicated values, not a program.
    pub fn is_values(&self) -> bool {
        !self.values.is_empty()
    }

    pub fn difference(&self, other: &Program) -> String {
        if self.name != other.name {
            return format!("different programs ({} and {})", self.name, other.name);
        }
        if !self.values.is_empty() || !other.values.is_empty() {
            return self.values_difference(other);
        }
        if self.args != other.args {
            return format!(
                "{} with other arguments ({} against {})",
                self.name, self.args, other.args
            );
        }
        let head = format!(
            "{} traced to different programs ({} and {} lines of StableHLO)",
            self.name, self.size, other.size
        );
        // The first collective that differs, a list that ends first
        // reading as "none" there.
        let differs = (0..self.collectives.len().max(other.collectives.len()))
            .find(|&i| self.collectives.get(i) != other.collectives.get(i));
        let said = |c: &Vec<String>, i: usize| c.get(i).cloned().unwrap_or_else(|| "none".into());
        let words = match differs {
            Some(i) => format!(
                "{head}; their collective #{} differs: {} against {}",
                i + 1,
                said(&self.collectives, i),
                said(&other.collectives, i)
            ),
            None => format!(
                "{head}; the same collectives, different computations (fingerprints {} and {})",
                short(&self.fingerprint),
                short(&other.fingerprint)
            ),
        };
        words
    }
}

impl Program {
    /// Replicated values that differ: the first leaf whose copies differ,
    /// and how many do.
    fn values_difference(&self, other: &Program) -> String {
        let split = |v: &String| {
            let (path, sum) = v.rsplit_once(' ').unwrap_or((v.as_str(), ""));
            (path.to_string(), sum.to_string())
        };
        let mine: Vec<(String, String)> = self.values.iter().map(split).collect();
        let theirs: Vec<(String, String)> = other.values.iter().map(split).collect();
        if mine.iter().map(|v| &v.0).ne(theirs.iter().map(|v| &v.0)) {
            return format!(
                "the replicated leaves differ ({} and {} leaves)",
                mine.len(),
                theirs.len()
            );
        }
        let differ: Vec<usize> = (0..mine.len())
            .filter(|&i| mine[i].1 != theirs[i].1)
            .collect();
        match differ.first() {
            Some(&i) => format!(
                "{} of {} replicated leaves differ, the first {} (checksums {} and {})",
                differ.len(),
                mine.len(),
                mine[i].0,
                mine[i].1,
                theirs[i].1
            ),
            None => "the same values, other arguments".to_string(),
        }
    }
}

fn short(fingerprint: &str) -> &str {
    &fingerprint[..fingerprint.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(name: &str, args: &str, size: u64, collectives: &[&str]) -> Program {
        Program {
            fingerprint: format!("{name}{args}{size}{}", collectives.join(",")),
            name: name.into(),
            args: args.into(),
            size,
            collectives: collectives.iter().map(ToString::to_string).collect(),
            site: "train.py:9".into(),
            values: Vec::new(),
        }
    }

    #[test]
    fn replicated_values_that_differ_name_the_first_leaf() {
        let values = |sums: &[&str]| Program {
            fingerprint: sums.join(""),
            name: "replicated values at step 0".into(),
            args: String::new(),
            size: 0,
            collectives: Vec::new(),
            site: "train.py:30".into(),
            values: ["params/b", "params/w", "step"]
                .iter()
                .zip(sums)
                .map(|(p, s)| format!("{p} {s}"))
                .collect(),
        };
        let a = values(&["11", "22", "33"]);
        let b = values(&["11", "29", "33"]);
        assert_eq!(
            a.difference(&b),
            "1 of 3 replicated leaves differ, the first params/w (checksums 22 and 29)"
        );
    }

    #[test]
    fn the_first_thing_that_differs_is_said() {
        let a = program("jit_step", "f32[16,4]", 40, &["all-reduce f32[]"]);
        let b = program("jit_eval", "f32[16,4]", 40, &["all-reduce f32[]"]);
        assert_eq!(
            a.difference(&b),
            "different programs (jit_step and jit_eval)"
        );
        let b = program("jit_step", "f32[14,4]", 40, &["all-reduce f32[]"]);
        assert_eq!(
            a.difference(&b),
            "jit_step with other arguments (f32[16,4] against f32[14,4])"
        );
        let b = program("jit_step", "f32[16,4]", 44, &["all-gather f32[8]"]);
        assert!(a
            .difference(&b)
            .ends_with("collective #1 differs: all-reduce f32[] against all-gather f32[8]"));
        let b = program(
            "jit_step",
            "f32[16,4]",
            44,
            &["all-reduce f32[]", "all-gather f32[8]"],
        );
        assert!(a
            .difference(&b)
            .ends_with("collective #2 differs: none against all-gather f32[8]"));
        let b = program("jit_step", "f32[16,4]", 41, &["all-reduce f32[]"]);
        assert!(a.difference(&b).contains("the same collectives"));
    }
}
