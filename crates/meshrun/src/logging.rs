//! `tracing` to stderr: `-v` raises the level, `MESHRUN_LOG` (an env-filter
//! directive) overrides it, `NO_COLOR` or a non-terminal turns colour off.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("MESHRUN_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let color = std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal();
    // A second init (tests, or the Python module calling twice) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(color)
        .with_target(false)
        .try_init();
}
