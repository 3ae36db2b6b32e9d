//! The scale rig's process (see `meshrun_loadtest::scale`): reads the
//! scenario (JSON) from its first argument and the run token from the file
//! named by its second, plays every fake host, and prints what it saw as
//! JSON on stdout.

use std::io::Write as _;

use meshrun_loadtest::scale::{play, Scenario};
use meshrun_protocol::token::Token;

fn main() {
    let mut args = std::env::args().skip(1);
    let scenario: Scenario =
        serde_json::from_str(&args.next().expect("a scenario")).expect("a scenario as JSON");
    let token_file = args.next().expect("the run's token file");
    let token = Token::from_hex(std::fs::read_to_string(token_file).expect("a token").trim())
        .expect("a run token");
    // A connection per fake host and worker, as the controller has.
    meshrun_core::limits::raise_open_files();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let timings = runtime.block_on(play(scenario, token));
    let text = serde_json::to_string(&timings).expect("timings serialize");
    writeln!(std::io::stdout().lock(), "{text}").expect("stdout takes the timings");
}
