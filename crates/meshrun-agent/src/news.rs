//! What a host that joined a run by itself says as the run goes: `meshrun
//! join` prints each as one sentence, so the person who started it sees
//! which run it joined, each attempt it takes part in, and how the run
//! ended, without reading the controller's terminal.

use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum News {
    /// The controller took this host (once: later attempts keep the rank).
    Joined {
        run: String,
        controller: SocketAddr,
        host: u32,
    },
    /// This host's workers of an attempt were started.
    Attempt { attempt: u32, ranks: Vec<u32> },
    /// The attempt is over and another follows: a restart, not a loss.
    AttemptOver { attempt: u32 },
    /// The control connection broke (the network, or the controller went
    /// away): this host's workers were stopped, and it joins again.
    Lost {
        controller: SocketAddr,
        attempt: Option<u32>,
        why: String,
    },
    /// The run is over, in this state when the controller said.
    Over { run: String, state: Option<String> },
}

impl fmt::Display for News {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            News::Joined {
                run,
                controller,
                host,
            } => write!(f, "joined run '{run}' at {controller} as host {host}"),
            News::Attempt { attempt, ranks } => {
                let ranks: Vec<String> = ranks.iter().map(u32::to_string).collect();
                let (what, list) = match ranks.len() {
                    0 => return write!(f, "attempt {attempt}: no worker of this host started"),
                    1 => ("rank", ranks[0].clone()),
                    _ => ("ranks", ranks.join(", ")),
                };
                write!(f, "attempt {attempt}: started {what} {list} on this host")
            }
            News::AttemptOver { attempt } => write!(
                f,
                "attempt {attempt} is over and the run restarts: joining the next attempt"
            ),
            News::Lost {
                controller,
                attempt,
                why,
            } => {
                write!(
                    f,
                    "lost the connection to the controller at {controller} ({why})"
                )?;
                if let Some(attempt) = attempt {
                    write!(f, "; this host's workers of attempt {attempt} were stopped")?;
                }
                f.write_str("; joining again")
            }
            News::Over { run, state } => match state {
                Some(state) => write!(f, "run '{run}' ended: {state}"),
                None => write!(f, "run '{run}' ended"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_is_one_sentence_without_debug_formatting() {
        let at: SocketAddr = "10.0.0.1:29400".parse().unwrap();
        let said = [
            News::Joined {
                run: "gpt".into(),
                controller: at,
                host: 1,
            },
            News::Attempt {
                attempt: 2,
                ranks: vec![2, 3],
            },
            News::AttemptOver { attempt: 1 },
            News::Lost {
                controller: at,
                attempt: Some(1),
                why: "connection reset by peer".into(),
            },
            News::Over {
                run: "gpt".into(),
                state: Some("succeeded".into()),
            },
        ]
        .map(|n| n.to_string());
        assert_eq!(said[0], "joined run 'gpt' at 10.0.0.1:29400 as host 1");
        assert_eq!(said[1], "attempt 2: started ranks 2, 3 on this host");
        assert_eq!(
            said[3],
            "lost the connection to the controller at 10.0.0.1:29400 (connection reset by peer); \
             this host's workers of attempt 1 were stopped; joining again"
        );
        assert_eq!(said[4], "run 'gpt' ended: succeeded");
        assert!(said
            .iter()
            .all(|s| !s.contains("Some(") && !s.contains('{')));
    }
}
