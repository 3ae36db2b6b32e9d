//! Threads the engine starts in a Python process never take its signals.
//!
//! The kernel hands a process signal to any thread that does not block
//! it. `CPython`'s C handler then only marks the signal pending, and in 3.11
//! it makes the main thread look at it promptly only when the handler ran
//! on the main thread itself: a Ctrl-C taken by a loader thread could wait
//! until something else made the main thread look. Threads
//! inherit their creator's signal mask, so they are made with every signal
//! blocked.

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};

/// Runs `f` (which starts threads) with every signal blocked in this
/// thread, then restores its mask: a signal that comes meanwhile waits,
/// and is delivered when the mask is restored.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let mut old = SigSet::empty();
    let blocked =
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), Some(&mut old)).is_ok();
    let out = f();
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    out
}
