//! What a demo run produced: the outcome it prints (or writes as JSON with `--json`) and
//! checks.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use penrose_agent::status::AgentStatus;
use penrose_aggregator::control::reply::{EvidenceReply, ExportReply, ExportedBundle, StatusReply};
use penrose_core::paillier::PublicKey;
use penrose_design::report::Report;
use serde::Serialize;

use super::applications::{Applications, trace_name};
use super::capture::AgentFigures;
use super::check::Checked;
use super::fleet::Fleet;
use super::issuers::{IssuerStatuses, Issuers};
use super::process::Stages;
use super::release::{Audited, Closed, Decrypted};
use super::workload::Workload;

/// What a run produced.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// "ebpf" or "test-replay" (host 0's agent's source).
    pub source: String,
    /// What was replayed.
    pub workload: String,
    /// Replayer processes (eBPF mode).
    pub replayers: usize,
    /// Agent processes (hosts).
    pub agents: usize,
    /// Agents that hold the design server's signed key list, fetched from the aggregation
    /// server and verified under the list-signing key they pin: all of them.
    pub key_list_agents: usize,
    /// The application every popular-host agent runs.
    pub popular: String,
    /// Applications run by one host alone: never decrypted.
    pub alone: Vec<String>,
    /// Capture windows the agent ran.
    pub windows: u64,
    /// Launches it captured.
    pub launches: u64,
    /// Samples it took.
    pub samples: u64,
    /// Histograms it sealed.
    pub sealed: usize,
    /// Reports the aggregator counted (all of them sealed by the agent).
    pub counted: usize,
    /// Bytes of one report frame.
    pub report_bytes: usize,
    /// Classes the aggregator formed.
    pub classes: usize,
    /// (class, counter) aggregates decrypted.
    pub decrypted: usize,
    /// (class, counter) aggregates held back under k (withheld by the aggregation server or
    /// held back by the design server).
    pub held_back: usize,
    /// Reports the aggregator counted from the hosts that ran an application alone, and how
    /// many of them reached a decryption (must be none).
    pub alone_counted: usize,
    /// Of those, reports inside a decrypted sum.
    pub alone_decrypted: usize,
    /// Every decrypted aggregate equals the sealed histograms, nothing under k contributors
    /// was decrypted, and nothing of a lone host was.
    pub exact: bool,
    /// Admission: the issuer, the tokens, and whether every counted report was admitted by one.
    pub admission: Admission,
    /// Contributor evidence: the auditor's party's tokens, and whether the auditor counted
    /// every released sum's contributors from them.
    pub evidence: Evidence,
    /// The decrypted aggregates.
    pub rows: Vec<Row>,
    /// Processes killed with SIGKILL and restarted mid-run.
    pub killed: Vec<String>,
    /// Seconds per stage.
    pub seconds: BTreeMap<String, f64>,
    /// The architects' page of this run (`penrose-design report --html`): `html/index.html`
    /// in the run's directory, kept with `--keep`.
    pub html: PathBuf,
    /// With `--tor`: what went over the private Tor network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tor: Option<TorFigures>,
    /// The decrypted joint views, each checked against the agents' raw values.
    pub joints: Vec<JointCheck>,
}

/// What each step of a run returned that the outcome is made of.
pub(super) struct Finished<'a> {
    pub workload: Workload,
    pub apps: Applications,
    pub fleet: Fleet,
    pub agents: AgentFigures,
    /// Host 0's last status.
    pub host0: AgentStatus,
    /// Processes killed with SIGKILL and restarted mid-run.
    pub killed: Vec<String>,
    /// Both issuers, and what they said last.
    pub issuers: (&'a Issuers, IssuerStatuses),
    pub closed: Closed,
    pub decrypted: Decrypted,
    pub checked: Checked,
    /// The design server's public key (the size of a report frame under it).
    pub public: &'a PublicKey,
    pub stages: Stages,
}

impl Outcome {
    /// The outcome of a finished run, with its admission and evidence figures.
    pub(super) fn of(run: Finished<'_>) -> Result<Self> {
        let (issuers, statuses) = run.issuers;
        let (exported, checked) = (&run.closed.exported, run.checked);
        let admission = Admission::of(
            issuers.admission.listen.clone(),
            &statuses.admission,
            (run.agents.tokens_fetched, run.agents.partition_warnings),
            (&exported.json, &run.closed.status, &run.decrypted.report),
            (checked.counted, checked.spent_rows),
        );
        let evidence = Evidence::of(
            &issuers.evidence.listen,
            &statuses.evidence,
            &exported.json,
            &exported.evidence_json,
            &run.decrypted.audited,
        );
        let compared = checked.compared;
        Ok(Outcome {
            html: run.decrypted.html,
            source: run.fleet.source.to_string(),
            workload: run.workload.describe,
            replayers: run.fleet.replayers.len(),
            agents: run.fleet.hosts.len(),
            key_list_agents: run.agents.key_list_agents,
            popular: trace_name(&run.apps.popular),
            alone: run.apps.alone.iter().map(|t| trace_name(t)).collect(),
            windows: run.host0.windows,
            launches: run.host0.launches,
            samples: run.host0.pipeline.samples,
            sealed: checked.sealed,
            counted: checked.counted,
            report_bytes: super::report_frame_len(run.public)?,
            classes: checked.classes,
            decrypted: compared.decrypted,
            held_back: compared.held_back,
            alone_counted: compared.alone_counted,
            alone_decrypted: compared.alone_decrypted,
            exact: compared.exact,
            admission,
            evidence,
            rows: compared.rows,
            killed: run.killed,
            seconds: run.stages.into_seconds(),
            tor: run.closed.tor,
            joints: compared.joints,
        })
    }
}

/// What went over the private Tor network in a `--tor` run.
#[derive(Debug, Serialize)]
pub struct TorFigures {
    /// Where the network lived (keys, torrc files, logs), in the run's directory.
    pub network_dir: PathBuf,
    /// Seconds from starting the seven tors until a client could use them.
    pub ready_seconds: f64,
    /// Reports acked to the agents, every one over Tor (their status files' `uploads.accepted`;
    /// a restarted agent's count starts again).
    pub reports: u64,
    /// Tor streams the agents opened (one per QUIC connection: per upload attempt and per token
    /// fetch), and attempts that failed, per their status files.
    pub streams: u64,
    /// See `streams`.
    pub stream_failures: u64,
    /// Per agent: the circuits of its last streams (at most 64), and how many distinct.
    pub circuits: Vec<AgentCircuits>,
    /// Every agent's last streams each ran on a circuit of its own.
    pub isolated: bool,
    /// The aggregation server's metrics page: `penrose_transport_carrier_streams_total`
    /// (TCP streams on its stream port) by outcome, and
    /// `penrose_transport_connections_total{outcome="accepted"}` (QUIC connections that
    /// completed the handshake, UDP or stream alike), since its last start.
    pub carrier_streams: BTreeMap<String, u64>,
    /// See `carrier_streams`.
    pub connections_accepted: u64,
    /// UDP datagrams received in the demo's network namespace (`Udp: InDatagrams` of
    /// `/proc/thread-self/net/snmp`) from before the agents started until they stopped: a
    /// QUIC report over UDP would need some, nothing else there sends UDP.
    pub udp_datagrams: u64,
    /// Connections on the servers' stream ports seen while open (sampled every 250 ms during
    /// the capture), by the exit whose process held the other end: "none" when a process
    /// that is no exit held it, "closed before the lookup" when no process held it any more
    /// by the time it was looked up.
    pub sampled_connections: BTreeMap<String, u64>,
    /// Every tor the demo started was stopped and reaped.
    pub stopped: bool,
}

/// One agent's recent Tor circuits.
#[derive(Debug, Serialize)]
pub struct AgentCircuits {
    /// Streams listed in its status.
    pub recent: usize,
    /// Distinct circuits among them.
    pub distinct: usize,
}

impl TorFigures {
    /// Everything went over Tor: reports were acked; the aggregation server accepted streams
    /// on its stream port and no more QUIC connections than that (a connection over UDP would
    /// have no stream); no UDP datagram arrived in the namespace; every connection sampled on
    /// the stream ports came from an exit; every agent's streams had circuits of their own;
    /// and the network was stopped.
    pub fn over_tor(&self) -> bool {
        let accepted = self.carrier_streams.get("accepted").copied().unwrap_or(0);
        self.reports > 0
            && accepted > 0
            && self.connections_accepted <= accepted
            && self.udp_datagrams == 0
            && !self.sampled_connections.contains_key("none")
            && self.isolated
            && self.stopped
    }
}

/// What the run's admission tokens did.
#[derive(Debug, Serialize)]
pub struct Admission {
    /// The token issuer's QUIC address.
    pub issuer: String,
    /// Credentials enrolled at the issuer (one per host), per its `status`.
    pub enrolled: u64,
    /// Tokens the issuer issued (every day it keeps counts of), per its `status`.
    pub tokens_issued: u64,
    /// Tokens the agents received and stored, per their status files (a restarted agent's
    /// count starts again).
    pub tokens_fetched: u64,
    /// Tokens whose MAC the aggregation server verified since its last start (retries of a
    /// report already counted are verified again), per its `status`.
    pub tokens_verified: u64,
    /// Reports of the exported epochs, and of those the ones admitted with a spent token, per
    /// the bundle's epoch summaries (`export --json`).
    pub epoch_reports: u64,
    /// See `epoch_reports`.
    pub reports_with_tokens: u64,
    /// Rows of the aggregation server's Spent table: one per report admitted by a token.
    pub spent_rows: usize,
    /// The design server's report: "contributor bound enforced by admission tokens: yes".
    pub bound_enforced_by_tokens: bool,
    /// Partition attempts the agents saw (key sets or issuances not matching the keys
    /// published), per their status files: none may be.
    pub partition_warnings: u64,
    /// Every report the aggregator counted was admitted by a token spent once: the bundle
    /// counts each of them as admitted with a token, the design server's report says the bound
    /// was enforced by tokens, the Spent table holds one row per counted report; and no agent
    /// saw a partition attempt.
    pub admitted: bool,
}

/// What the run's contributor evidence did (docs/crypto.md, "Contributor evidence").
#[derive(Debug, Serialize)]
pub struct Evidence {
    /// The evidence issuer's (the release auditor's party's) QUIC address.
    pub issuer: String,
    /// Tokens it issued, per its `status`.
    pub tokens_issued: u64,
    /// Sums the bundle released.
    pub entries: u64,
    /// Reports the bundle's evidence lists for them, and of those the ones that carried an
    /// evidence token (`export-evidence --json`).
    pub reports_listed: u64,
    /// See `reports_listed`.
    pub reports_with_tokens: u64,
    /// Tokens the auditor counted (its `status`).
    pub tokens_counted: u64,
    /// Partial decryptions the auditor gave, and sums it withheld.
    pub partials: u64,
    /// See `partials`.
    pub withheld: u64,
    /// Evidence rows the aggregation server deleted once the auditor had answered
    /// (`forget-evidence --through 1`): every report of the epoch, withheld ones included.
    pub rows_forgotten: u64,
    /// The evidence covers every released sum, every listed report carried an evidence token,
    /// the auditor counted each of them once and gave a partial for every released sum; then
    /// the server deleted at least those reports' rows.
    pub counted: bool,
}

impl Evidence {
    /// The figures of a run: the evidence issuer's status, the bundle's export, its evidence
    /// file's (`export-evidence --json`) and what the auditor did.
    pub(super) fn of(
        issuer: &str,
        status: &penrose_issuer::admin::Status,
        exported: &ExportReply,
        written: &EvidenceReply,
        audited: &Audited,
    ) -> Self {
        let entries = exported_figure(exported, |b| b.entries as u64);
        Evidence {
            issuer: issuer.to_string(),
            tokens_issued: status.epochs.iter().map(|e| e.tokens).sum(),
            entries,
            reports_listed: written.reports,
            reports_with_tokens: written.with_tokens,
            tokens_counted: audited.tokens_counted,
            partials: audited.partials,
            withheld: audited.withheld,
            rows_forgotten: audited.rows_forgotten,
            counted: entries > 0
                && audited.rows_forgotten >= written.reports
                && written.entries == entries
                && written.reports > 0
                && written.with_tokens == written.reports
                && audited.tokens_counted == written.with_tokens
                && audited.partials == entries
                && audited.withheld == 0,
        }
    }
}

/// A figure of the exported bundle; 0 when nothing was exported.
fn exported_figure(exported: &ExportReply, figure: impl Fn(&ExportedBundle) -> u64) -> u64 {
    exported.bundle.as_ref().map_or(0, figure)
}

impl Admission {
    /// The figures of a run: the issuer's status; the agents' (tokens fetched, partition
    /// warnings); the bundle's export, the aggregation server's status and the design
    /// server's report; (reports counted, rows of the Spent table).
    pub(super) fn of(
        issuer: String,
        status: &penrose_issuer::admin::Status,
        (tokens_fetched, partition_warnings): (u64, u64),
        (exported, agg_status, report): (&ExportReply, &StatusReply, &Report),
        (counted_reports, spent_rows): (usize, usize),
    ) -> Self {
        let epoch_reports = exported_figure(exported, |b| b.epoch_reports);
        let reports_with_tokens = exported_figure(exported, |b| b.reports_with_tokens);
        let bound_enforced_by_tokens = report.bound_enforced_by_tokens;
        Admission {
            issuer,
            enrolled: status.enrolled,
            tokens_issued: status.epochs.iter().map(|e| e.tokens).sum(),
            tokens_fetched,
            tokens_verified: agg_status
                .admission
                .as_ref()
                .map_or(0, |a| a.tokens_verified),
            epoch_reports,
            reports_with_tokens,
            spent_rows,
            bound_enforced_by_tokens,
            partition_warnings,
            admitted: counted_reports > 0
                && epoch_reports == counted_reports as u64
                && reports_with_tokens == epoch_reports
                && spent_rows == counted_reports
                && bound_enforced_by_tokens
                && partition_warnings == 0,
        }
    }
}

/// One decrypted joint view, checked against the agents' raw values.
#[derive(Debug, Serialize)]
pub struct JointCheck {
    /// Class.
    pub class: u32,
    /// The view's name.
    pub view: String,
    /// Raw (x, y) values the agents recorded for its reports.
    pub samples: u64,
    /// Its quadrants as the design server split them.
    pub quadrants: Vec<JointQuadrant>,
    /// Samples per quadrant in the decrypted grid, as the design server counted them.
    pub from_grid: Vec<u64>,
    /// Raw values per quadrant, compared with the split directly.
    pub from_values: Vec<u64>,
    /// Each quadrant holds as many of the raw values, and the same share, as the design
    /// server counted in the decrypted grid.
    pub exact: bool,
}

/// One quadrant of a decrypted joint view.
#[derive(Debug, Serialize)]
pub struct JointQuadrant {
    /// What it covers.
    pub describe: String,
    /// Its share of the samples.
    pub share: f64,
    /// Its share of kernel time (estimated), where an axis is a duration.
    pub time_share: Option<f64>,
}

/// One decrypted (class, counter).
#[derive(Debug, Serialize)]
pub struct Row {
    /// Class.
    pub class: u32,
    /// Counter name.
    pub counter: String,
    /// Unit suffix.
    pub unit: String,
    /// Reports.
    pub reports: u64,
    /// The fewest contributors behind them.
    pub contributors: u64,
    /// Samples.
    pub samples: u64,
    /// Mean, p50, p90 at bin resolution.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// Equal to the agent's sealed histograms, bin for bin.
    pub exact: bool,
}
