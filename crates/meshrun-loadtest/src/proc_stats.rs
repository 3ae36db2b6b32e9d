//! This process's CPU time and resident memory, from `/proc/self`: the
//! load tests run the controller in their own process.

/// CPU seconds of this process and of its children that have ended, from
/// `/proc/self/stat`: utime, stime, cutime, cstime, in `USER_HZ` ticks
/// (100 a second on Linux).
pub fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name may hold spaces; the fields after it do not.
    let fields: Vec<f64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // After the state letter (not a number): ppid is fields[0], utime fields[10].
    let tick = |i: usize| fields.get(i).copied().unwrap_or(0.0) / 100.0;
    (tick(10) + tick(11), tick(12) + tick(13))
}

/// This process's resident memory in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds the whole machine spent busy (every core: user, system,
/// interrupts) and those a hypervisor gave to other machines (steal),
/// since boot, from `/proc/stat`. A measurement's other load is the busy
/// time it did not spend itself.
pub fn machine_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let tick = |i: usize| fields.get(i).copied().unwrap_or(0.0) / 100.0;
    // user nice system idle iowait irq softirq steal
    let busy = tick(0) + tick(1) + tick(2) + tick(5) + tick(6);
    (busy, tick(7))
}

/// The cores this process may run on.
pub fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}
