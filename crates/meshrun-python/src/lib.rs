//! `meshrun._native`: converts Python values to engine types and back, and
//! releases the GIL around every engine call. No logic of its own.

mod checkpoint;
mod data;
mod errors;
mod run;
mod worker;

use pyo3::prelude::*;

/// Runs the `meshrun` command line in this process (the console script).
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>, python: String, agent_command: Vec<String>) -> i32 {
    let launcher = meshrun::Launcher {
        python: Some(python.into()),
        agent_command,
    };
    py.detach(|| meshrun::main(argv, &launcher))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(run::run, m)?)?;
    m.add_class::<worker::WorkerClient>()?;
    m.add_class::<data::DataSource>()?;
    m.add_class::<checkpoint::CheckpointReader>()?;
    m.add_function(wrap_pyfunction!(checkpoint::write_shards, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::resume_checkpoint, m)?)?;
    m.add_class::<data::DataLoader>()?;
    errors::register(m)?;
    Ok(())
}
