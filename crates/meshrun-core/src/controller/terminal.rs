//! The terminal as a reader that may be slow, paused or gone.
//!
//! Everything the controller shows on stdout and stderr (ranks' output, the
//! progress bar, its own notes) goes through one writer thread, fed by a
//! bounded queue. Supervision only ever enqueues, so a pipe that nobody
//! reads, a terminal paused with Ctrl-S or a stream closed by the reader
//! can never stall the loop that reads heartbeats and writes the logs.
//! What the terminal cannot take is dropped once the queue is full, and a
//! note says how many lines were dropped; a closed stream is given up
//! silently (its lines are still in the rank logs).

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use indicatif::TermLike;

/// How many bytes may wait for the terminal before lines are dropped.
const QUEUE_LIMIT: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Stdout,
    Stderr,
}

enum Piece {
    /// Bytes for one stream, written as they are.
    Text { to: Target, text: String },
    /// Lines were dropped here, this many.
    Dropped(u64),
}

#[derive(Default)]
struct State {
    queue: VecDeque<Piece>,
    bytes: usize,
    /// A piece is being written (so "empty" is not yet "written").
    busy: bool,
    closed_stdout: bool,
    closed_stderr: bool,
}

impl State {
    fn closed(&self, to: Target) -> bool {
        match to {
            Target::Stdout => self.closed_stdout,
            Target::Stderr => self.closed_stderr,
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a piece is queued, and when the queue empties.
    changed: Condvar,
}

/// A handle on the process's terminal writer; cheap to clone.
#[derive(Clone)]
pub struct Terminal {
    shared: Arc<Shared>,
    limit: usize,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Terminal")
    }
}

/// The one terminal writer of this process, started on first use.
pub fn terminal() -> Terminal {
    static TERMINAL: OnceLock<Terminal> = OnceLock::new();
    TERMINAL
        .get_or_init(|| Terminal::start(QUEUE_LIMIT, sink))
        .clone()
}

fn sink(to: Target) -> Box<dyn Write> {
    match to {
        Target::Stdout => Box::new(io::stdout()),
        Target::Stderr => Box::new(io::stderr()),
    }
}

impl Terminal {
    fn start(limit: usize, open: impl Fn(Target) -> Box<dyn Write> + Send + 'static) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let writer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("meshrun-terminal".into())
            .spawn(move || write_loop(&writer, &open))
            .expect("a thread for the terminal");
        Self { shared, limit }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A line of a worker's output: dropped (and counted) when the terminal
    /// is this far behind.
    pub fn line(&self, to: Target, text: &str) {
        self.push(to, format!("{text}\n"), true);
    }

    /// A line of meshrun's own (restarts, warnings, progress): always kept,
    /// these are few.
    pub fn note(&self, text: &str) {
        self.push(Target::Stderr, format!("{text}\n"), false);
    }

    /// Bytes drawn by the progress bar; a redraw that does not fit is
    /// simply skipped.
    fn draw(&self, text: String) {
        let mut state = self.lock();
        if state.closed_stderr || state.bytes + text.len() > self.limit {
            return;
        }
        state.bytes += text.len();
        state.queue.push_back(Piece::Text {
            to: Target::Stderr,
            text,
        });
        self.shared.changed.notify_all();
    }

    fn push(&self, to: Target, text: String, droppable: bool) {
        let mut state = self.lock();
        if state.closed(to) {
            return;
        }
        if droppable && state.bytes + text.len() > self.limit {
            match state.queue.back_mut() {
                Some(Piece::Dropped(n)) => *n += 1,
                _ => state.queue.push_back(Piece::Dropped(1)),
            }
            return;
        }
        state.bytes += text.len();
        state.queue.push_back(Piece::Text { to, text });
        self.shared.changed.notify_all();
    }

    /// Waits until everything queued is written, at most `timeout` (the
    /// terminal may be paused for good); true when it was.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while !state.queue.is_empty() || state.busy {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }
}

fn write_loop(shared: &Shared, open: &dyn Fn(Target) -> Box<dyn Write>) {
    let mut stdout = open(Target::Stdout);
    let mut stderr = open(Target::Stderr);
    let mut state = shared
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let Some(piece) = state.queue.pop_front() else {
            state.busy = false;
            shared.changed.notify_all();
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            continue;
        };
        state.busy = true;
        let (to, text) = match piece {
            Piece::Text { to, text } => {
                state.bytes -= text.len();
                (to, text)
            }
            Piece::Dropped(n) => (
                Target::Stderr,
                format!(
                    "meshrun: {n} line{} of output not shown: the terminal did not keep up \
                     (every line is in the rank logs)\n",
                    if n == 1 { "" } else { "s" }
                ),
            ),
        };
        drop(state);
        let out = match to {
            Target::Stdout => &mut stdout,
            Target::Stderr => &mut stderr,
        };
        let written = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        state = shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if written.is_err() {
            // Closed by its reader (EPIPE) or otherwise broken: the run goes
            // on without it.
            match to {
                Target::Stdout => state.closed_stdout = true,
                Target::Stderr => state.closed_stderr = true,
            }
            let before = state.queue.len();
            state
                .queue
                .retain(|p| !matches!(p, Piece::Text { to: t, .. } if *t == to));
            if state.queue.len() != before {
                state.bytes = state
                    .queue
                    .iter()
                    .map(|p| match p {
                        Piece::Text { text, .. } => text.len(),
                        Piece::Dropped(_) => 0,
                    })
                    .sum();
            }
        }
    }
}

/// The progress bar draws through the same queue, so a paused terminal
/// cannot block it either, and its redraws keep their order with the
/// lines printed above it.
impl TermLike for Terminal {
    fn width(&self) -> u16 {
        console::Term::stderr().size().1
    }

    fn height(&self) -> u16 {
        console::Term::stderr().size().0
    }

    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        if n > 0 {
            self.draw(format!("\x1b[{n}A"));
        }
        Ok(())
    }

    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        if n > 0 {
            self.draw(format!("\x1b[{n}B"));
        }
        Ok(())
    }

    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        if n > 0 {
            self.draw(format!("\x1b[{n}C"));
        }
        Ok(())
    }

    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        if n > 0 {
            self.draw(format!("\x1b[{n}D"));
        }
        Ok(())
    }

    fn write_line(&self, s: &str) -> io::Result<()> {
        self.draw(format!("{s}\n"));
        Ok(())
    }

    fn write_str(&self, s: &str) -> io::Result<()> {
        self.draw(s.to_string());
        Ok(())
    }

    fn clear_line(&self) -> io::Result<()> {
        self.draw("\r\x1b[2K".to_string());
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that blocks until released, then records what it got.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        got: Arc<Mutex<Vec<u8>>>,
        fail: bool,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.fail {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            let (lock, cv) = &*self.open;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Gate {
        fn release(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
        fn text(&self) -> String {
            String::from_utf8(self.got.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn a_paused_terminal_never_blocks_and_drops_are_counted() {
        let out = Gate::default();
        let err = Gate::default();
        let (o, e) = (out.clone(), err.clone());
        let term = Terminal::start(100, move |to| match to {
            Target::Stdout => Box::new(o.clone()),
            Target::Stderr => Box::new(e.clone()),
        });
        let started = Instant::now();
        for i in 0..1000 {
            term.line(Target::Stdout, &format!("line {i:04}"));
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "enqueueing blocked"
        );
        assert!(
            !term.flush(Duration::from_millis(50)),
            "nothing can be written yet"
        );
        out.release();
        err.release();
        assert!(term.flush(Duration::from_secs(5)));
        let shown = out.text();
        let kept = shown.lines().count();
        assert!(kept < 1000 && shown.starts_with("line 0000\n"), "{shown}");
        // Every line is either shown or counted in a note, in order.
        let dropped: usize = err
            .text()
            .lines()
            .map(|l| {
                l.strip_prefix("meshrun: ")
                    .and_then(|l| l.split(' ').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .expect("a count of dropped lines")
            })
            .sum();
        assert_eq!(kept + dropped, 1000);
    }

    #[test]
    fn a_closed_stream_is_given_up_without_error() {
        let out = Gate {
            fail: true,
            ..Gate::default()
        };
        let err = Gate::default();
        err.release();
        let (o, e) = (out.clone(), err.clone());
        let term = Terminal::start(1 << 20, move |to| match to {
            Target::Stdout => Box::new(o.clone()),
            Target::Stderr => Box::new(e.clone()),
        });
        for _ in 0..10 {
            term.line(Target::Stdout, "lost");
        }
        term.note("still here");
        assert!(term.flush(Duration::from_secs(5)));
        assert_eq!(err.text(), "still here\n");
    }
}
