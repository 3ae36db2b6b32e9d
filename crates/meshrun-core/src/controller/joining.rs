//! What a run whose hosts join by themselves (`--listen`) says before its
//! first attempt: how many hosts it waits for, for how long, and what to
//! run on them. The wait it names is the one the machine keeps (see
//! `machine/elastic.rs` and `machine/deadlines.rs`).

use std::time::Duration;

use meshrun_record::names;

use meshrun_plan::RunPlan;

/// The lines printed when the run starts to wait; `token_in_env`: the run
/// was given its token in `MESHRUN_TOKEN`, which the hosts must share.
pub(super) fn join_command(plan: &RunPlan, token_in_env: bool) -> String {
    let addr = std::net::SocketAddr::new(plan.control_host, plan.control_port);
    let token = if token_in_env {
        "with the same MESHRUN_TOKEN in its environment".to_string()
    } else {
        format!(
            "with --token-file {} (copy that file there: it is readable by its owner only)",
            plan.run_dir.join(names::TOKEN).display()
        )
    };
    format!(
        "meshrun: run '{}' {}: on each, run\n  meshrun join {addr}\n{token}",
        plan.name,
        wait_text(plan)
    )
}

/// The first attempt's wait. A fixed run waits the join timeout for every
/// host. An elastic one needs MIN hosts within the join timeout; once they
/// are there it waits the rejoin timeout for the rest (never past the join
/// timeout), then starts on those there. Host 0 is the controller's own,
/// there at once: with MIN 1 the rejoin timeout is the whole wait.
fn wait_text(plan: &RunPlan) -> String {
    let join = plan.join_timeout();
    let more = plan.hosts - 1;
    let Some(el) = plan.elastic.as_ref().filter(|e| e.min_hosts < plan.hosts) else {
        return format!("waits for {more} more host(s) for up to {} s", secs(join));
    };
    let rejoin = el.rejoin_timeout();
    let range = format!("--hosts {}:{}", el.min_hosts, plan.hosts);
    if el.min_hosts == 1 {
        return format!(
            "waits up to {} s for {more} more host(s), then starts on those there ({range})",
            secs(rejoin.min(join))
        );
    }
    format!(
        "waits for up to {more} more host(s): it needs {} within {} s ({range}), then waits up \
         to {} s more for the rest before it starts on those there",
        el.min_hosts - 1,
        secs(join),
        secs(rejoin)
    )
}

/// Seconds as given (`--rejoin-timeout 2.5` is 2.5, 20 is 20).
fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshrun_machine::sim::plan;
    use meshrun_plan::Elastic;

    fn listening(hosts: u32, elastic: Option<(u32, f64)>, join_s: Option<f64>) -> RunPlan {
        let mut p = plan(hosts);
        p.name = "el".into();
        p.hosts = hosts;
        p.procs_per_host = 1;
        p.rendezvous = true;
        p.control_port = 29400;
        p.join_timeout_s = join_s;
        p.elastic = elastic.map(|(min, rejoin)| Elastic {
            min_hosts: min,
            rejoin_timeout_s: Some(rejoin),
            any_count: false,
        });
        p
    }

    fn first_line(p: &RunPlan) -> String {
        join_command(p, true).lines().next().unwrap().to_string()
    }

    #[test]
    fn an_elastic_run_from_one_host_says_it_waits_the_rejoin_timeout_not_the_join_timeout() {
        assert_eq!(
            first_line(&listening(2, Some((1, 20.0)), None)),
            "meshrun: run 'el' waits up to 20 s for 1 more host(s), then starts on those there \
             (--hosts 1:2): on each, run"
        );
        // The join timeout still ends the wait when it is the shorter one.
        assert!(first_line(&listening(2, Some((1, 20.0)), Some(5.0))).contains("waits up to 5 s"));
        assert!(first_line(&listening(2, Some((1, 2.5)), None)).contains("waits up to 2.5 s"));
    }

    #[test]
    fn an_elastic_run_that_needs_more_than_its_own_host_names_both_waits() {
        assert_eq!(
            first_line(&listening(4, Some((2, 60.0)), None)),
            "meshrun: run 'el' waits for up to 3 more host(s): it needs 1 within 300 s \
             (--hosts 2:4), then waits up to 60 s more for the rest before it starts on those \
             there: on each, run"
        );
    }

    #[test]
    fn a_fixed_run_waits_the_join_timeout_for_every_host() {
        let p = listening(3, None, Some(30.0));
        assert_eq!(
            first_line(&p),
            "meshrun: run 'el' waits for 2 more host(s) for up to 30 s: on each, run"
        );
        let text = join_command(&p, false);
        assert!(
            text.contains("\n  meshrun join 127.0.0.1:29400\n"),
            "{text}"
        );
        assert!(text.ends_with("readable by its owner only)"), "{text}");
        // MIN = MAX is a fixed count.
        assert!(first_line(&listening(2, Some((2, 9.0)), None)).contains("for up to 300 s"));
    }
}
