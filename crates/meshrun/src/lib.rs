//! The `meshrun` command line. The binary (and the Python console script)
//! only hand their arguments to [`main`]; parsing is in [`cli`], each
//! command in [`commands`].

mod ckpt;
pub mod cli;
pub mod commands;
mod join;
mod lag;
mod logging;
mod logs;
mod profile;
pub mod runs;
mod serve;
mod status_parts;
mod stop;
mod table;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::Parser;

/// How this process can start more of itself: the interpreter workers run
/// under, and the command that starts `meshrun agent`.
#[derive(Debug, Clone, Default)]
pub struct Launcher {
    pub python: Option<PathBuf>,
    pub agent_command: Vec<String>,
}

/// Exit statuses: 0 success, 1 a run failed, 2 a usage error; a run
/// stopped by a signal exits with 128 + the signal number.
pub mod exit {
    pub const SUCCESS: i32 = 0;
    pub const FAILURE: i32 = 1;
    pub const USAGE: i32 = 2;
}

/// Parses `args` (program name first) and runs the command.
pub fn main<I, T>(args: I, launcher: &Launcher) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let parsed = cli::Cli::try_parse_from(args).and_then(|cli| match &cli.command {
        cli::Command::Run(run) => cli::misplaced_option(run).map_or(Ok(cli), Err),
        _ => Ok(cli),
    });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // Said as every other usage error is: "meshrun: error: ...".
            let _ = write!(std::io::stderr().lock(), "meshrun: {}", e.render());
            return exit::USAGE;
        }
        Err(e) => {
            let _ = e.print();
            return exit::SUCCESS;
        }
    };
    logging::init(cli.verbose);
    commands::dispatch(cli, launcher)
}
