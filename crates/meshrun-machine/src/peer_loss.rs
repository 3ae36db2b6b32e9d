//! A rank whose collective failed because a peer is gone is not the
//! attempt's cause. When rank 1 is killed, rank 0's all-reduce fails at
//! once ("Connection reset by peer") and its report can reach the
//! controller before rank 1's agent reports the exit: taken in the order
//! they arrived, the attempt would be blamed on rank 0 and rank 1's own
//! death read as meshrun's stop. So such an exception waits, for at most
//! [`PEER_LOSS_GRACE`], for the failure that caused it; the attempt is
//! stopped when either comes (the root cause, at once; the exception, at
//! the grace's end), so recovery waits only when no cause shows.

use std::time::{Duration, Instant};

use meshrun_record::Cause;

use super::Machine;

/// How long an exception that reads as a lost peer waits for its cause:
/// an agent reports an exit the moment it reaps the worker, so the cause
/// arrives in milliseconds when there is one.
pub const PEER_LOSS_GRACE: Duration = Duration::from_secs(1);

/// What collectives say when the process at the other end is gone: Gloo's
/// socket errors (CPU), NCCL's (GPU), and the connection errors beneath.
const PEER_GONE: &[&str] = &[
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "remote process exited",
];

/// Whether an exception's message says a peer of the rank is gone.
pub fn reads_as_peer_loss(message: &str) -> bool {
    PEER_GONE.iter().any(|p| message.contains(p))
}

/// An exception held back while its cause may still arrive.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub since: Instant,
    pub rank: u32,
    pub cause: Cause,
}

impl Machine {
    /// Rank `rank` raised an exception: holds it back when it reads as a
    /// lost peer and nothing has failed yet; otherwise it fails the
    /// attempt as any failure does.
    pub(super) fn exception(&mut self, now: Instant, rank: u32, cause: Cause) {
        let peer_lost =
            matches!(&cause, Cause::Exception { message, .. } if reads_as_peer_loss(message));
        if peer_lost && self.failure.is_none() && self.stop.is_none() {
            if self.held.is_none() {
                self.held = Some(Held {
                    since: now,
                    rank,
                    cause,
                });
            }
            return;
        }
        self.fail(now, rank, cause);
    }

    /// When the held exception fails the attempt unless its cause comes.
    pub(super) fn held_deadline(&self) -> Option<Instant> {
        self.held.as_ref().map(|h| h.since + PEER_LOSS_GRACE)
    }

    /// The grace is over: the held exception is the attempt's failure.
    pub(super) fn release_held(&mut self, now: Instant) {
        if self.held_deadline().is_some_and(|d| now >= d) {
            let held = self.held.take().expect("a deadline means a held exception");
            self.fail(now, held.rank, held.cause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reads_as_peer_loss;

    #[test]
    fn the_collectives_words_for_a_lost_peer_are_recognised() {
        assert!(reads_as_peer_loss(
            "UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:1177: Connection reset by peer"
        ));
        assert!(reads_as_peer_loss(
            "NCCL error: remote process exited or there was a network error"
        ));
        assert!(!reads_as_peer_loss("ValueError: loss is nan"));
        assert!(!reads_as_peer_loss("RESOURCE_EXHAUSTED: out of memory"));
    }
}
