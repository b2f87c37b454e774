//! The fleet's capture for the chosen time, with progress and the faults of `--faults`; the
//! fleet's stop once the spools drained; and what the agents' last status files say.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use indicatif::ProgressBar;
use penrose_agent::status::AgentStatus;
use penrose_core::paillier::PublicKey;

use super::fleet::{Fleet, Host};
use super::process::{Bins, Children, spinner, wait_for};
use super::tor::{AgentRoutes, StreamSampler, TorRun, udp_datagrams};
use super::{Aggregator, Options, read_status};

/// What the capture left behind.
pub(super) struct Captured {
    /// When it started (the stage "agents: capture and upload" runs until the issuers stop).
    pub started: Instant,
    /// Processes killed with SIGKILL and restarted (`--faults`).
    pub killed: Vec<String>,
    /// With `--tor`: the connections seen on the servers' stream ports.
    pub sampled: Option<StreamSampler>,
    /// With `--tor`: UDP datagrams received in the namespace while the agents ran.
    pub udp_datagrams: u64,
}

/// Lets the fleet capture for `options.capture` (and, with `--faults`, until both faults
/// struck), then stops it: the replayers, then the agents once their spools drained.
pub(super) fn capture(
    (options, bins): (&Options, &Bins),
    fleet: &Fleet,
    (agg, issuer_stream, tor): (&Aggregator, &str, Option<&TorRun>),
    children: &mut Children,
) -> Result<Captured> {
    let t = Instant::now();
    let bar = spinner(options.quiet, "capturing");
    let mut killed = Vec::new();
    let hard_stop = options.capture + Duration::from_secs(120);
    // With --tor: the servers' stream ports, and per connection seen on one while open, the
    // exit whose process held its other end.
    let mut sampled = tor.map(|t| StreamSampler::new(t, [&agg.stream, issuer_stream]));
    while t.elapsed() < options.capture || (options.faults && killed.len() < 2) {
        ensure!(
            t.elapsed() < hard_stop,
            "the faults did not all strike within {hard_stop:?}; see {}",
            fleet.hosts[0].log.display()
        );
        std::thread::sleep(Duration::from_millis(250));
        if let Some(sampled) = &mut sampled {
            sampled.sample()?;
        }
        if options.faults {
            strike_fault((bins, &bar), &fleet.hosts[0], agg, &mut killed, children)?;
        }
        bar.set_message(progress(&fleet.hosts));
        check_running(&fleet.hosts, children)?;
    }
    stop_fleet(fleet, tor.is_some(), children)?;
    bar.finish_and_clear();
    let udp_datagrams = match fleet.udp_before {
        Some(before) => udp_datagrams()?.saturating_sub(before),
        None => 0,
    };
    Ok(Captured {
        started: t,
        killed,
        sampled,
        udp_datagrams,
    })
}

/// Faults strike the first host once its agent has delivered something (its counts restart
/// with it), so that each one lands mid-stream rather than during a start-up: first its
/// agent is killed with SIGKILL and restarted on its state, then the aggregation server,
/// down for 2 s.
fn strike_fault(
    (bins, bar): (&Bins, &ProgressBar),
    first: &Host,
    agg: &Aggregator,
    killed: &mut Vec<String>,
    children: &mut Children,
) -> Result<()> {
    let delivered = |host: &Host| read_status(&host.state).map_or(0, |s| s.uploads.accepted);
    if killed.len() >= 2 || delivered(first) < 20 {
        return Ok(());
    }
    if killed.is_empty() {
        children.kill(first.child)?;
        bar.println("fault: host 0's agent was killed with SIGKILL; restarting it on its state");
        // Its last status is gone with it: the next one is the new agent's.
        let _ = std::fs::remove_file(first.state.join("status.json"));
        let agent = super::start_agent(&bins.path("penrose-agent"), &first.config, &first.log)?;
        children.replace(first.child, agent);
        killed.push("penrose-agent".to_string());
    } else {
        children.kill(agg.index)?;
        bar.println("fault: the aggregation server was killed with SIGKILL; down for 2 s");
        std::thread::sleep(Duration::from_secs(2));
        children.replace(agg.index, agg.restart(bins)?);
        killed.push("penrose-aggregator".to_string());
    }
    Ok(())
}

/// The fleet's progress, from the agents' status files.
fn progress(hosts: &[Host]) -> String {
    let statuses: Vec<AgentStatus> = hosts.iter().filter_map(|h| read_status(&h.state)).collect();
    let total = |f: &dyn Fn(&AgentStatus) -> u64| statuses.iter().map(f).sum::<u64>();
    format!(
        "{} agents: {} launches, {} samples, {} sealed, {} accepted, {} spooled",
        statuses.len(),
        total(&|s| s.launches),
        total(&|s| s.pipeline.samples),
        total(&|s| s.pipeline.sealed),
        total(&|s| s.uploads.accepted),
        total(&|s| s.spool.reports),
    )
}

/// No agent may exit before it is stopped.
fn check_running(hosts: &[Host], children: &mut Children) -> Result<()> {
    for host in hosts {
        if let Some(status) = children.exited(host.child)? {
            bail!(
                "an agent exited early ({status}); see {}",
                host.log.display()
            );
        }
    }
    Ok(())
}

/// Stops the replayers; lets the spools drain before stopping the agents (what they seal on
/// stop stays spooled): an empty spool in a status written after the replayers stopped.
fn stop_fleet(fleet: &Fleet, tor: bool, children: &mut Children) -> Result<()> {
    for index in fleet.replayers.iter().copied() {
        children.stop(index, Duration::from_secs(10))?;
    }
    let stopped = SystemTime::now();
    // Over Tor a report takes a circuit of its own and a few hundred ms more.
    let drain = Duration::from_secs(if tor { 90 } else { 30 });
    let _ = wait_for(drain, || {
        Ok(fleet.hosts.iter().all(|h| {
            let fresh = std::fs::metadata(h.state.join("status.json"))
                .and_then(|m| m.modified())
                .is_ok_and(|m| m > stopped + Duration::from_millis(600));
            fresh && read_status(&h.state).is_some_and(|s| s.spool.reports == 0)
        }))
    });
    for host in &fleet.hosts {
        children.stop(host.child, Duration::from_secs(60))?;
    }
    Ok(())
}

/// What the agents did with their tokens and the design server's key list, from their last
/// status files; and with `--tor`, what went through Tor.
pub(super) struct AgentFigures {
    /// Agents holding the design server's key list: all of them.
    pub key_list_agents: usize,
    /// Tokens the agents received and stored.
    pub tokens_fetched: u64,
    /// Partition attempts they saw.
    pub partition_warnings: u64,
    /// With `--tor`: their routes.
    pub routes: Option<AgentRoutes>,
}

/// Every agent must hold the design server's key list (sequence 1, naming `public` today);
/// with `tor`, every one must have run over Tor.
pub(super) fn agent_figures(hosts: &[Host], public: &PublicKey, tor: bool) -> Result<AgentFigures> {
    let mut figures = AgentFigures {
        key_list_agents: 0,
        tokens_fetched: 0,
        partition_warnings: 0,
        routes: tor.then(AgentRoutes::default),
    };
    for host in hosts {
        let status = read_status(&host.state).context("an agent's last status")?;
        ensure!(
            status.design_key.list_sequence == Some(1)
                && status.design_key.key_id_today == Some(public.key_id().to_string()),
            "an agent does not hold the design server's key list: {:?}; see {}",
            status.design_key,
            host.log.display()
        );
        figures.key_list_agents += 1;
        figures.tokens_fetched += status.tokens.issued;
        figures.partition_warnings += status.tokens.partition_warnings;
        if let Some(routes) = &mut figures.routes {
            routes.add(&status, &host.log)?;
        }
    }
    Ok(figures)
}
