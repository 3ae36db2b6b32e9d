//! The environment contracts of the launchers users come from, set for
//! every worker beside meshrun's own, so that a program written for one of
//! them runs unmodified (docs/migrating.md has the table).
//!
//! Where two contracts name the same variable differently, the value is
//! the one that lets both kinds of program run: `JAX_COORDINATOR_ADDRESS`
//! is JAX's `host:port` but `MaxText`'s CPU path resolves it as a bare host
//! name (and hangs on `host:port`), so it holds the bare host, with the
//! port in `JAX_COORDINATOR_PORT`; a JAX program that reads it is still
//! right, because meshrun's `jax.distributed.initialize` passes the whole
//! address (`MESHRUN_COORDINATOR`) and never lets JAX read this variable.
//! meshrun itself reads none of these: only its own `MESHRUN_*` values,
//! which a program has no reason to change.

use crate::worker_env::Placement;

/// One launcher's variables, for the docs and the spares.
pub struct Contract {
    pub launcher: &'static str,
    pub vars: &'static [&'static str],
}

/// Every contract meshrun sets, in the order of the docs' table.
pub const CONTRACTS: &[Contract] = &[
    Contract {
        launcher: "jax.distributed (JAX's own variables)",
        vars: &["JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT"],
    },
    Contract {
        launcher: "Kubeflow JAXJob",
        vars: &[
            "PROCESS_ID",
            "NUM_PROCESSES",
            "COORDINATOR_ADDRESS",
            "COORDINATOR_PORT",
        ],
    },
    Contract {
        launcher: "Kubernetes indexed Job (MaxText's CPU path, XPK)",
        vars: &[
            "JOB_INDEX",
            "JOB_COMPLETION_INDEX",
            "PROCESSES_IN_JOB",
            "JAX_PROCESS_COUNT",
        ],
    },
    Contract {
        launcher: "MaxText's GPU path",
        vars: &["JAX_COORDINATOR_IP", "NNODES", "NODE_RANK"],
    },
    Contract {
        launcher: "torchrun",
        vars: &[
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT",
        ],
    },
];

/// Whether `key` is a variable of one of the contracts: all of them
/// change with the attempt (its coordinator, its world size).
pub fn is_contract_var(key: &str) -> bool {
    CONTRACTS.iter().any(|c| c.vars.contains(&key))
}

/// The coordinator's host (an IP address, brackets removed for IPv6) and
/// port, from the `host:port` meshrun chose.
pub fn split_coordinator(coordinator: &str) -> (&str, &str) {
    match coordinator.rsplit_once(':') {
        Some((host, port)) => (host.trim_start_matches('[').trim_end_matches(']'), port),
        None => (coordinator, ""),
    }
}

/// The variables of every contract for one worker of attempt `attempt`.
pub fn contract_env(at: Placement, coordinator: &str, attempt: u32) -> Vec<(String, String)> {
    let (host, port) = split_coordinator(coordinator);
    let rank = at.rank.to_string();
    let world = at.world_size.to_string();
    let pairs: [(&str, String); 22] = [
        ("JAX_COORDINATOR_ADDRESS", host.into()),
        ("JAX_COORDINATOR_PORT", port.into()),
        ("PROCESS_ID", rank.clone()),
        ("NUM_PROCESSES", world.clone()),
        ("COORDINATOR_ADDRESS", host.into()),
        ("COORDINATOR_PORT", port.into()),
        // One indexed Job whose completion index is the rank: MaxText
        // computes JOB_INDEX * PROCESSES_IN_JOB + JOB_COMPLETION_INDEX,
        // which is the rank whatever the hosts' shapes.
        ("JOB_INDEX", "0".into()),
        ("JOB_COMPLETION_INDEX", rank.clone()),
        ("PROCESSES_IN_JOB", world.clone()),
        ("JAX_PROCESS_COUNT", world.clone()),
        ("JAX_COORDINATOR_IP", host.into()),
        // MaxText's GPU path passes these as JAX's process count and id
        // (XPK runs one process per node there).
        ("NNODES", world.clone()),
        ("NODE_RANK", rank.clone()),
        ("RANK", rank),
        ("WORLD_SIZE", world),
        ("LOCAL_RANK", at.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE", at.local_world_size.to_string()),
        ("GROUP_RANK", at.host.to_string()),
        ("GROUP_WORLD_SIZE", at.num_hosts.to_string()),
        ("MASTER_ADDR", host.into()),
        ("MASTER_PORT", port.into()),
        (
            "TORCHELASTIC_RESTART_COUNT",
            attempt.saturating_sub(1).to_string(),
        ),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rank: u32) -> Placement {
        Placement {
            rank,
            world_size: 4,
            local_rank: rank % 2,
            local_world_size: 2,
            host: rank / 2,
            num_hosts: 2,
        }
    }

    fn get<'a>(env: &'a [(String, String)], key: &str) -> &'a str {
        let found: Vec<_> = env.iter().filter(|(k, _)| k == key).collect();
        assert_eq!(found.len(), 1, "{key} set {} times", found.len());
        &found[0].1
    }

    #[test]
    fn every_contract_variable_is_set_once_and_listed() {
        let env = contract_env(at(3), "10.0.0.1:4567", 2);
        for (k, _) in &env {
            assert!(is_contract_var(k), "{k} is set but in no contract");
        }
        for c in CONTRACTS {
            for v in c.vars {
                get(&env, v);
            }
        }
    }

    #[test]
    fn each_launchers_arithmetic_gives_the_rank_and_the_coordinator() {
        let env = contract_env(at(3), "10.0.0.1:4567", 2);
        let n = |k: &str| get(&env, k).parse::<u32>().unwrap();
        // MaxText's CPU path: JOB_INDEX * PROCESSES_IN_JOB + JOB_COMPLETION_INDEX.
        assert_eq!(
            n("JOB_INDEX") * n("PROCESSES_IN_JOB") + n("JOB_COMPLETION_INDEX"),
            3
        );
        assert_eq!(n("JAX_PROCESS_COUNT"), 4);
        assert_eq!((n("PROCESS_ID"), n("NUM_PROCESSES")), (3, 4));
        assert_eq!((n("NODE_RANK"), n("NNODES")), (3, 4));
        assert_eq!((n("RANK"), n("WORLD_SIZE")), (3, 4));
        assert_eq!((n("LOCAL_RANK"), n("LOCAL_WORLD_SIZE")), (1, 2));
        assert_eq!((n("GROUP_RANK"), n("GROUP_WORLD_SIZE")), (1, 2));
        assert_eq!(n("TORCHELASTIC_RESTART_COUNT"), 1);
        for host in [
            "JAX_COORDINATOR_ADDRESS",
            "COORDINATOR_ADDRESS",
            "JAX_COORDINATOR_IP",
            "MASTER_ADDR",
        ] {
            assert_eq!(get(&env, host), "10.0.0.1");
        }
        for port in ["JAX_COORDINATOR_PORT", "COORDINATOR_PORT", "MASTER_PORT"] {
            assert_eq!(get(&env, port), "4567");
        }
    }

    #[test]
    fn an_ipv6_coordinator_loses_its_brackets() {
        assert_eq!(split_coordinator("[::1]:80"), ("::1", "80"));
        assert_eq!(split_coordinator("127.0.0.1:80"), ("127.0.0.1", "80"));
    }
}
