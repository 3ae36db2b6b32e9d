//! What a worker tells the controller without waiting for an answer: its
//! timings, the checkpoints and memory copies it wrote (or could not), what
//! its state needs, its device memory, its executables, and the flight
//! recorder's programs and calls. Each is queued for the writer thread.

use meshrun_protocol::FromWorker;

use super::{Outgoing, WorkerClient};

impl WorkerClient {
    /// Queues `msg` for the writer thread. A send fails only once the
    /// writer has ended (the connection closed), when nothing can be said.
    pub(super) fn tell(&self, msg: FromWorker) {
        let _ = self.tx.send(Outgoing::Msg(msg));
    }

    /// Where this worker's time went, at the end of its program.
    pub fn timing(&self, timing: meshrun_record::Timing) {
        self.tell(FromWorker::Timing { timing });
    }

    /// Tells the controller this rank's shards of checkpoint `step` are on
    /// disk (`leaves`), or its copy of the folder it handed over (`files`).
    pub fn checkpoint_written(
        &self,
        step: u64,
        leaves: Vec<meshrun_ckpt::manifest::Leaf>,
        files: Option<Vec<meshrun_ckpt::directory::FileRecord>>,
        extra: Option<serde_json::Value>,
    ) {
        self.tell(FromWorker::CheckpointWritten {
            step,
            leaves,
            files,
            extra,
        });
    }

    /// Says this rank wrote its shards of memory checkpoint `step` into its
    /// host's memory.
    pub fn memory_written(
        &self,
        step: u64,
        leaves: Vec<meshrun_ckpt::manifest::Leaf>,
        extra: Option<serde_json::Value>,
    ) {
        self.tell(FromWorker::MemoryWritten {
            step,
            leaves,
            extra,
        });
    }

    /// Says this rank could not write its shards of checkpoint `step`.
    pub fn save_failed(&self, step: u64, error: String) {
        self.tell(FromWorker::SaveFailed { step, error });
    }

    /// Says what the program's state needs per device.
    pub fn state_need(&self, need: meshrun_record::memory::StateNeed) {
        self.tell(FromWorker::StateNeed { need });
    }

    /// Says how many bytes the worker's first device holds, and held at
    /// most.
    pub fn device_memory(&self, current: u64, peak: u64) {
        self.tell(FromWorker::DeviceMemory { current, peak });
    }

    /// Says what became of one of this rank's jitted functions.
    pub fn executable(
        &self,
        name: String,
        outcome: meshrun_record::event::ExecutableOutcome,
        reason: Option<String>,
        seconds: f64,
    ) {
        self.tell(FromWorker::Executable {
            name,
            outcome,
            reason,
            seconds,
        });
    }

    /// Describes a program across processes before its first call.
    pub fn program(&self, program: meshrun_record::program::Program) {
        self.tell(FromWorker::Program { program });
    }

    /// Says this rank made its call `n` of programs across processes.
    pub fn call(&self, n: u64, fingerprint: String, site: String) {
        self.tell(FromWorker::Call {
            n,
            fingerprint,
            site,
        });
    }
}
