//! The demo's outcome on screen (without `--json`).

use super::outcome::{JointCheck, Outcome, TorFigures};

/// The decrypted histograms, then what the run did and checked, section by section.
pub(super) fn print_outcome(o: &Outcome, threshold: u64) {
    print_rows(o);
    print_run(o, threshold);
    print_admission(o);
    print_evidence(o);
    print_checks(o);
    print_joints(&o.joints);
    print_page_and_stages(o);
}

/// One line per decrypted (class, counter).
fn print_rows(o: &Outcome) {
    println!();
    println!(
        "{:>5}  {:<22} {:>7} {:>7} {:>8}  {:>12} {:>12} {:>12}  exact",
        "class", "counter", "reports", "owners", "samples", "mean", "p50", "p90"
    );
    for r in &o.rows {
        let value = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| with_unit(v, &r.unit));
        println!(
            "{:>5}  {:<22} {:>7} {:>6}+ {:>8}  {:>12} {:>12} {:>12}  {}",
            r.class,
            r.counter,
            r.reports,
            r.contributors,
            r.samples,
            value(r.mean),
            value(r.p50),
            value(r.p90),
            if r.exact { "yes" } else { "NO" }
        );
    }
}

/// The workload, the fleet, host 0's capture and both servers.
fn print_run(o: &Outcome, threshold: u64) {
    println!();
    println!("workload: {}", o.workload);
    println!(
        "fleet: {} agents; {} ran on every popular host, {} each on one host alone.",
        o.agents,
        o.popular,
        o.alone.join(" and ")
    );
    println!(
        "host 0 ({} source{}): {} windows, {} launches, {} samples. All agents: {} histograms \
         sealed and encrypted, {} counted by the aggregation server; a report (with its token) is {} bytes \
         on the wire.",
        o.source,
        if o.replayers > 0 {
            format!(
                ", {} replayer processes on the stand-in libcuda",
                o.replayers
            )
        } else {
            String::new()
        },
        o.windows,
        o.launches,
        o.samples,
        o.sealed,
        o.counted,
        o.report_bytes
    );
    println!(
        "aggregation server: {} classes, one epoch closed and released. design server: {} \
         (class, counter) aggregates decrypted, {} held back under k = {threshold} contributors \
         (counted as reports / 24, rounded up).",
        o.classes, o.decrypted, o.held_back
    );
}

/// The admission tokens.
fn print_admission(o: &Outcome) {
    let a = &o.admission;
    println!(
        "admission: token issuer on {}, {} credentials enrolled (one per host); {} tokens issued \
         ({} received by the agents), {} verified by the aggregation server{}; of the {} reports \
         of the released epoch {} were admitted with a token, each spent once ({} rows in the \
         spent table); contributor bound enforced by admission tokens: {}; partition warnings: \
         {}.",
        a.issuer,
        a.enrolled,
        a.tokens_issued,
        a.tokens_fetched,
        a.tokens_verified,
        if o.killed.iter().any(|k| k == "penrose-aggregator") {
            " since its restart"
        } else {
            ""
        },
        a.epoch_reports,
        a.reports_with_tokens,
        a.spent_rows,
        if a.bound_enforced_by_tokens {
            "yes"
        } else {
            "NO"
        },
        a.partition_warnings,
    );
}

/// The contributor evidence.
fn print_evidence(o: &Outcome) {
    let e = &o.evidence;
    println!(
        "contributor evidence: the release auditor's party's issuer on {} issued {} tokens; the \
         bundle's {} released sums list {} reports, {} with an evidence token; the auditor \
         counted {} tokens and gave {} partials ({} withheld), after which the server deleted \
         {} evidence rows: {}.",
        e.issuer,
        e.tokens_issued,
        e.entries,
        e.reports_listed,
        e.reports_with_tokens,
        e.tokens_counted,
        e.partials,
        e.withheld,
        e.rows_forgotten,
        if e.counted {
            "every released sum counted from evidence"
        } else {
            "NOT every sum counted from evidence"
        },
    );
}

/// The key list, the lone hosts and the checks' verdicts.
fn print_checks(o: &Outcome) {
    println!(
        "design key list: {} of {} agents fetched the design server's signed list from the \
         aggregation server and verified it under the list-signing key they pin.",
        o.key_list_agents, o.agents
    );
    println!(
        "reports of the hosts that ran an application alone: {} counted, {} decrypted.",
        o.alone_counted, o.alone_decrypted
    );
    println!(
        "every decrypted aggregate equals the agents' sealed histograms bin for bin, and nothing \
         under k contributors was decrypted: {}",
        if o.exact { "yes" } else { "NO" }
    );
    println!(
        "every report the aggregation server counted was admitted by an admission token: {}",
        if o.admission.admitted { "yes" } else { "NO" }
    );
}

/// Each decrypted joint view's quadrants.
fn print_joints(joints: &[JointCheck]) {
    for j in joints {
        println!(
            "joint view {} of class {} ({} samples): quadrant shares from the decrypted grid \
             equal those counted from the agents' raw values: {}",
            j.view,
            j.class,
            j.samples,
            if j.exact { "yes" } else { "NO" }
        );
        for q in &j.quadrants {
            let time = q.time_share.map_or(String::new(), |t| {
                format!(", {:.1}% of kernel time", t * 100.0)
            });
            println!(
                "    {}: {:.1}% of samples{time}",
                q.describe,
                q.share * 100.0
            );
        }
    }
}

/// With `--tor`, what went over Tor; the architects' page; seconds per stage.
fn print_page_and_stages(o: &Outcome) {
    if let Some(t) = &o.tor {
        print_tor(t);
    }
    println!(
        "the architects' page of this run: {} (one file; the run's directory is removed at \
         the end unless --keep is given)",
        o.html.display()
    );
    for (stage, s) in &o.seconds {
        println!("  {stage:<38} {s:>7.2} s");
    }
}

fn print_tor(t: &TorFigures) {
    let yes = |b: bool| if b { "yes" } else { "NO" };
    let carrier = |outcome: &str| t.carrier_streams.get(outcome).copied().unwrap_or(0);
    println!(
        "tor: the private network (in {}) was usable {:.1} s after it started; {} reports were \
         acked over Tor; the agents opened {} Tor streams (one per upload attempt and per token \
         fetch), {} attempts failed.",
        t.network_dir.display(),
        t.ready_seconds,
        t.reports,
        t.streams,
        t.stream_failures,
    );
    println!(
        "tor: distinct circuits among each agent's last streams (distinct/streams): {}; a \
         circuit of its own for every stream: {}.",
        t.circuits
            .iter()
            .map(|c| format!("{}/{}", c.distinct, c.recent))
            .collect::<Vec<_>>()
            .join(" "),
        yes(t.isolated),
    );
    println!(
        "tor: the aggregation server's metrics: penrose_transport_carrier_streams_total \
         accepted {}, idle {}, refused {}, malformed {}; QUIC connections accepted in all {} \
         (none without a stream: {}). UDP datagrams received in the demo's network namespace \
         while the agents ran: {}.",
        carrier("accepted"),
        carrier("idle"),
        carrier("refused_server_full"),
        carrier("malformed"),
        t.connections_accepted,
        yes(t.connections_accepted <= carrier("accepted")),
        t.udp_datagrams,
    );
    println!(
        "tor: connections seen open on the servers' stream ports (sampled every 250 ms), by the \
         exit holding their other end: {}.",
        if t.sampled_connections.is_empty() {
            "none seen".to_string()
        } else {
            t.sampled_connections
                .iter()
                .map(|(exit, n)| format!("{exit} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    println!(
        "tor: every tor process the demo started was stopped: {}; everything went over Tor: {}",
        yes(t.stopped),
        yes(t.over_tor()),
    );
}

/// A value with its unit, scaled to read at a glance (durations in s/ms/µs, sizes in KiB/MiB).
pub(super) fn with_unit(v: f64, unit: &str) -> String {
    let scales: &[(f64, &str)] = match unit {
        "ns" => &[(1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns")],
        "B" => &[(1_048_576.0, "MiB"), (1024.0, "KiB"), (1.0, "B")],
        other => return format!("{v:.1}{other}"),
    };
    let (div, name) = scales
        .iter()
        .find(|(div, _)| v.abs() >= *div)
        .or(scales.last())
        .copied()
        .unwrap_or((1.0, unit));
    format!("{:.1} {name}", v / div)
}
