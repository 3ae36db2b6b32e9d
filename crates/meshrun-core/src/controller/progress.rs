//! Live progress of a run on the terminal: one status line (step, loss,
//! steps/s, tokens/s, ETA, attempt, a marker while a checkpoint is being
//! written), redrawn in place under rank 0's output. Without a terminal it
//! becomes a plain line every [`LINE_EVERY`]; with `--quiet`, nothing.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

use super::terminal::terminal;

/// How often a plain progress line is printed when stderr is not a terminal.
pub const LINE_EVERY: Duration = Duration::from_secs(30);

/// The bar's text is rebuilt at most this often, however fast reports come.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// Steps/s is measured over the reports of this last stretch of time.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, else plain lines.
    #[default]
    Auto,
    Bar,
    Lines,
    Off,
}

impl ProgressMode {
    fn resolve(self) -> Self {
        match self {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Lines,
            other => other,
        }
    }
}

pub struct Progress {
    mode: ProgressMode,
    bar: Option<ProgressBar>,
    attempt: u32,
    started: Instant,
    step: Option<u64>,
    total: Option<u64>,
    /// The metric shown as the loss: the run's `--loss-metric`, else found
    /// by name in the first report that has one.
    loss_key: Option<String>,
    loss: Option<f64>,
    tokens_per_s: Option<f64>,
    saving: Option<u64>,
    /// Since which step checkpoint saves have been failing.
    saves_failing: Option<u64>,
    /// What the cluster holds back while the run waits for it.
    waiting: Option<String>,
    samples: VecDeque<(Instant, u64)>,
    /// When a worker last wrote a line: a program that never reports
    /// still shows it is alive.
    last_output: Option<Instant>,
    drawn: Option<Instant>,
    printed: Instant,
}

impl Progress {
    /// Shows `loss_metric` as the loss, when given.
    #[must_use]
    pub fn with_loss_metric(mut self, loss_metric: Option<String>) -> Self {
        self.loss_key = loss_metric;
        self
    }

    pub fn new(mode: ProgressMode, attempt: u32) -> Self {
        let mode = mode.resolve();
        let bar = (mode == ProgressMode::Bar).then(|| {
            // Drawn through the terminal writer: a paused terminal must
            // not block the supervisor that updates the bar.
            let bar = ProgressBar::with_draw_target(
                None,
                ProgressDrawTarget::term_like(Box::new(terminal())),
            );
            bar.set_style(spinner_style());
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        let now = Instant::now();
        let mut progress = Self {
            mode,
            bar,
            attempt,
            started: now,
            step: None,
            total: None,
            loss_key: None,
            loss: None,
            tokens_per_s: None,
            saving: None,
            saves_failing: None,
            waiting: None,
            samples: VecDeque::new(),
            last_output: None,
            drawn: None,
            printed: now,
        };
        progress.redraw(true);
        progress
    }

    /// The bar, for printing lines above it without tearing it.
    pub fn bar(&self) -> Option<ProgressBar> {
        self.bar.clone()
    }

    /// Rank 0's report.
    pub fn report(&mut self, step: Option<u64>, metrics: &Value, total_steps: Option<u64>) {
        if self.mode == ProgressMode::Off {
            return;
        }
        let now = Instant::now();
        if let Some(s) = step {
            self.step = Some(s);
            self.samples.push_back((now, s));
            while self.samples.front().is_some_and(|(t, _)| {
                now.duration_since(*t) > RATE_WINDOW && self.samples.len() > 2
            }) {
                self.samples.pop_front();
            }
        }
        if self.loss_key.is_none() {
            let names = metrics
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k.as_str());
            self.loss_key = meshrun_record::loss_key(None, names);
        }
        if let Some(loss) = self.loss_key.as_ref().and_then(|k| metrics[k].as_f64()) {
            self.loss = Some(loss);
        }
        if let Some(t) = metrics["tokens_per_s"].as_f64() {
            self.tokens_per_s = Some(t);
        }
        if total_steps.is_some() && total_steps != self.total {
            self.total = total_steps;
            if let (Some(bar), Some(total)) = (&self.bar, total_steps) {
                bar.set_style(bar_style());
                bar.set_length(total);
            }
        }
        self.redraw(false);
    }

    /// A worker wrote a line of output.
    pub fn output_line(&mut self) {
        self.last_output = Some(Instant::now());
    }

    /// A checkpoint of `step` is being written (`None`: committed).
    pub fn saving(&mut self, step: Option<u64>) {
        self.saving = step;
        self.redraw(true);
    }

    /// The save of `step` failed, as saves have since step `since`: it is
    /// no longer being written (a commit that failed never says so).
    pub fn save_failed(&mut self, step: u64, since: u64) {
        self.saves_failing = Some(since);
        if self.saving.is_some_and(|s| s <= step) {
            self.saving = None;
        }
        self.redraw(true);
    }

    /// A save was committed: saves work (again).
    pub fn saves_work(&mut self) {
        if self.saves_failing.take().is_some() {
            self.redraw(true);
        }
    }

    /// A line of meshrun's own, printed above the bar (whatever the mode:
    /// warnings are not progress).
    pub fn note(&self, text: &str) {
        let print = || terminal().note(text);
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// What the cluster holds back (`None`: nothing any more). Without a
    /// terminal, a wait that begins is printed at once; how it changes
    /// (Ray's counts move every poll) waits for the next line.
    pub fn waiting(&mut self, what: Option<String>) {
        if self.mode == ProgressMode::Off {
            return;
        }
        let began = self.waiting.is_none() && what.is_some();
        self.waiting = what;
        if self.mode == ProgressMode::Lines && began {
            self.print_line();
        }
        self.redraw(true);
    }

    /// Called every watch tick: plain lines are printed from here, and the
    /// bar's clock (`starting (12s)`) moves on.
    pub fn tick(&mut self) {
        if self.mode == ProgressMode::Lines && self.printed.elapsed() >= LINE_EVERY {
            self.print_line();
        }
        self.redraw(false);
    }

    fn print_line(&mut self) {
        self.printed = Instant::now();
        terminal().note(&format!("meshrun: {}", self.text()));
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }

    fn steps_per_s(&self) -> Option<f64> {
        let (t0, s0) = self.samples.front()?;
        let (t1, s1) = self.samples.back()?;
        let dt = t1.duration_since(*t0).as_secs_f64();
        (dt > 0.0 && s1 > s0).then(|| (s1 - s0) as f64 / dt)
    }

    /// "attempt 2 · step 120/150 · loss 2.345 · 3.2 steps/s · 3,300 tokens/s · ETA 9s · saving step-120"
    pub fn text(&self) -> String {
        self.text_at(Instant::now())
    }

    fn text_at(&self, now: Instant) -> String {
        let mut parts = vec![format!("attempt {}", self.attempt)];
        let up = short_duration(now.duration_since(self.started).as_secs_f64());
        match (self.step, self.total, self.last_output) {
            (Some(s), Some(t), _) => parts.push(format!("step {s}/{t}")),
            (Some(s), None, _) => parts.push(format!("step {s}")),
            // A program that reports no steps (most programs not written
            // for meshrun): that it runs, and when it last said anything.
            (None, _, Some(said)) => parts.push(format!(
                "running {up} · last output {} ago",
                short_duration(now.duration_since(said).as_secs_f64())
            )),
            (None, _, None) => parts.push(format!("starting ({up})")),
        }
        if let Some(loss) = self.loss {
            parts.push(format!("loss {loss:.4}"));
        }
        let rate = self.steps_per_s();
        if let Some(r) = rate {
            parts.push(format!("{r:.2} steps/s"));
        }
        if let Some(t) = self.tokens_per_s {
            parts.push(format!("{} tokens/s", thousands(t)));
        }
        if let (Some(r), Some(s), Some(t)) = (rate, self.step, self.total) {
            if t >= s {
                let secs = (t - s) as f64 / r;
                parts.push(format!("ETA {}", short_duration(secs)));
            }
        }
        if let Some(s) = self.saving {
            parts.push(format!("saving step-{s}"));
        }
        if let Some(s) = self.saves_failing {
            parts.push(format!("checkpoint saves failing since step-{s}"));
        }
        if let Some(w) = &self.waiting {
            parts.push(format!("waiting for Ray: {w}"));
        }
        parts.join(" · ")
    }

    fn redraw(&mut self, force: bool) {
        let Some(bar) = &self.bar else { return };
        if !force && self.drawn.is_some_and(|t| t.elapsed() < REDRAW_EVERY) {
            return;
        }
        self.drawn = Some(Instant::now());
        if let Some(s) = self.step {
            bar.set_position(s);
        }
        bar.set_message(self.text());
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg}").expect("a valid template")
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{bar:24}] {msg}")
        .expect("a valid template")
        .progress_chars("=> ")
}

fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn short_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_line_names_step_loss_rate_eta_and_a_save() {
        let mut p = Progress::new(ProgressMode::Lines, 2);
        let t0 = Instant::now();
        p.samples.push_back((t0, 100));
        p.samples.push_back((t0 + Duration::from_secs(10), 120));
        p.step = Some(120);
        p.report(
            None,
            &json!({"loss": 2.5, "tokens_per_s": 12345.6}),
            Some(150),
        );
        p.saving(Some(120));
        assert_eq!(
            p.text(),
            "attempt 2 · step 120/150 · loss 2.5000 · 2.00 steps/s · 12,346 tokens/s · ETA 15s · saving step-120"
        );
    }

    #[test]
    fn failing_saves_replace_the_save_marker_until_they_work_again() {
        let mut p = Progress::new(ProgressMode::Lines, 1);
        p.step = Some(855);
        p.saving(Some(855));
        p.save_failed(855, 855);
        assert_eq!(
            p.text(),
            "attempt 1 · step 855 · checkpoint saves failing since step-855"
        );
        p.saving(Some(860));
        p.save_failed(855, 855);
        assert!(p.text().contains("saving step-860 · "), "{}", p.text());
        p.saves_work();
        assert_eq!(p.text(), "attempt 1 · step 855 · saving step-860");
    }

    #[test]
    fn a_wait_for_the_cluster_shows_until_it_clears() {
        let mut p = Progress::new(ProgressMode::Lines, 1);
        p.waiting(Some("1 task needs {CPU: 1}".into()));
        assert!(p.text().starts_with("attempt 1 · starting ("));
        assert!(
            p.text()
                .ends_with(" · waiting for Ray: 1 task needs {CPU: 1}"),
            "{}",
            p.text()
        );
        p.waiting(None);
        assert!(!p.text().contains("waiting"), "{}", p.text());
    }

    #[test]
    fn a_program_that_reports_no_steps_shows_it_runs_and_when_it_last_spoke() {
        let mut p = Progress::new(ProgressMode::Lines, 1);
        let t0 = p.started;
        assert_eq!(
            p.text_at(t0 + Duration::from_secs(4)),
            "attempt 1 · starting (4s)"
        );
        p.output_line();
        let said = p.last_output.unwrap();
        assert_eq!(
            p.text_at(said + Duration::from_secs(75)),
            format!(
                "attempt 1 · running {} · last output 1m15s ago",
                short_duration((said + Duration::from_secs(75) - t0).as_secs_f64())
            )
        );
        // Its first step replaces both.
        p.report(Some(1), &json!({}), None);
        assert_eq!(p.text_at(said), "attempt 1 · step 1");
    }

    #[test]
    fn off_records_nothing() {
        let mut p = Progress::new(ProgressMode::Off, 1);
        p.report(Some(3), &json!({"loss": 1.0}), None);
        assert_eq!(p.step, None);
    }
}
