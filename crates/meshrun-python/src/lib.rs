//! `meshrun._native`: converts Python values to engine types and back, and
//! releases the GIL around every engine call that may block. No logic of
//! its own: checks and names (folders, files) come from the engine crates.

mod checkpoint;
mod config;
mod convert;
mod data;
mod errors;
mod executable;
mod run;
mod signals;
mod usage;
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
    m.add_class::<run::Plan>()?;
    m.add_class::<run::Outcome>()?;
    m.add_function(wrap_pyfunction!(run::plan, m)?)?;
    m.add_function(wrap_pyfunction!(run::run, m)?)?;
    m.add_class::<worker::WorkerClient>()?;
    m.add_function(wrap_pyfunction!(worker::stacks_file, m)?)?;
    m.add_function(wrap_pyfunction!(worker::profile_folder, m)?)?;
    m.add_function(wrap_pyfunction!(worker::read_metrics, m)?)?;
    m.add_class::<data::DataSource>()?;
    m.add_class::<data::DataLoader>()?;
    m.add_class::<checkpoint::CheckpointReader>()?;
    m.add_class::<checkpoint::WrittenShards>()?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoints_dir, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::write_shards, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::write_directory, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::fetch_directory, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::committed_checkpoints, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::resume_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::resume_choice, m)?)?;
    // The worker environment's names, by key: Python spells none itself.
    let env = pyo3::types::PyDict::new(m.py());
    for (key, name) in meshrun_protocol::env::ALL {
        env.set_item(key, name)?;
    }
    m.add("ENV", env)?;
    // The defaults of the Python API's settings: the engine's own.
    let defaults = pyo3::types::PyDict::new(m.py());
    for (key, value) in meshrun_plan::choices::defaults() {
        match value {
            meshrun_plan::choices::Default::Text(t) => defaults.set_item(key, t)?,
            meshrun_plan::choices::Default::Count(n) => defaults.set_item(key, n)?,
        }
    }
    m.add("DEFAULTS", defaults)?;
    m.add_function(wrap_pyfunction!(checkpoint::save_errors_continue, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::storage_roundtrip, m)?)?;
    m.add_function(wrap_pyfunction!(executable::store_executable, m)?)?;
    m.add_function(wrap_pyfunction!(executable::load_executable, m)?)?;
    m.add_function(wrap_pyfunction!(executable::remove_executable, m)?)?;
    m.add_function(wrap_pyfunction!(executable::list_executables, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_size, m)?)?;
    errors::register(m)?;
    Ok(())
}
