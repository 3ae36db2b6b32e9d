//! The `meshrun` binary: parse, run, exit. Everything else is in the library.

fn main() {
    let code = meshrun::main(std::env::args_os(), &meshrun::Launcher::default());
    std::process::exit(code);
}
