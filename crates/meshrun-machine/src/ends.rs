//! How each rank ended, as the attempt's failure summary needs it (the
//! controller's `summary` renders it).

use meshrun_record::ExitInfo;

/// What the summary needs to know about every rank.
pub struct RankEnd {
    pub rank: u32,
    pub exit: Option<ExitInfo>,
    pub stopped_by_meshrun: bool,
    /// It had finished its program successfully before the failure.
    pub finished_early: Option<EarlyFinish>,
    /// Its last line of output, which says why when it ended on its own
    /// (`terminate called after throwing ...`).
    pub last_line: Option<String>,
}

/// A rank that finished its program while the others still ran.
#[derive(Debug, Clone, Copy)]
pub struct EarlyFinish {
    /// Its last reported step then.
    pub last_step: Option<u64>,
}
