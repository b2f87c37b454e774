//! The release: the aggregation server closes the epoch and exports bundle 1 with its
//! contributor evidence; the design server imports both, the release auditor gives its
//! partial decryptions, and the design server decrypts what reached k contributors.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use penrose_aggregator::config::DataDir;
use penrose_aggregator::control::reply::{
    EvidenceReply, ExportReply, ForgetEvidenceReply, StatusReply,
};
use penrose_design::output::AuditSummary;
use penrose_design::report::Report;

use super::capture::Captured;
use super::outcome::TorFigures;
use super::process::{Bins, Children, Stages, json_output, output};
use super::tor::{self, AgentRoutes, TorRun};
use super::{Aggregator, Options};

/// What a run's export wrote: the bundle and its evidence file, with what each command said.
pub(super) struct Exported {
    bundle: PathBuf,
    /// `export --json`.
    pub json: ExportReply,
    evidence: PathBuf,
    /// `export-evidence --json`.
    pub evidence_json: EvidenceReply,
}

/// The aggregation server's part of the release, and what the servers' stop left.
pub(super) struct Closed {
    /// The bundle and its evidence file.
    pub exported: Exported,
    /// Its `status --json`, read while it served.
    pub status: StatusReply,
    /// With `--tor`: what went over the private Tor network, now stopped.
    pub tor: Option<TorFigures>,
}

/// Closes the epoch and exports while serving, reads the server's status (and with `--tor`
/// its metrics page), stops it; every server is stopped then, and so is the Tor network
/// (its Drop would do it on an error).
pub(super) fn close_epoch(
    (bins, dir): (&Bins, &Path),
    agg: &Aggregator,
    (tor, captured, routes): (Option<&mut TorRun>, &Captured, Option<AgentRoutes>),
    children: &mut Children,
    stages: &mut Stages,
) -> Result<Closed> {
    let t = Instant::now();
    let exported = close_and_export(bins, &agg.data, dir)?;
    let status: StatusReply = json_output(
        bins.command("penrose-aggregator")
            .arg("status")
            .arg("-d")
            .arg(agg.data.path())
            .arg("--json"),
        "penrose-aggregator status",
    )?;
    let metrics = match tor {
        Some(_) => tor::fetch_metrics(&agg.metrics)?,
        None => String::new(),
    };
    children.stop(agg.index, Duration::from_secs(30))?;
    let tor = match tor {
        Some(run) => Some(tor::stop_and_count(
            run,
            &metrics,
            routes.unwrap_or_default(),
            captured.sampled.as_ref(),
            captured.udp_datagrams,
        )?),
        None => None,
    };
    stages.record("aggregator: close epoch, export", t);
    Ok(Closed {
        exported,
        status,
        tor,
    })
}

/// Closes the open epoch, exports bundle 1 while serving and writes its contributor evidence
/// (`export-evidence`, written by the server), in `dir`.
fn close_and_export(bins: &Bins, agg: &DataDir, dir: &Path) -> Result<Exported> {
    let admin = |command: &str| {
        let mut cmd = bins.command("penrose-aggregator");
        cmd.arg(command).arg("-d").arg(agg.path());
        cmd
    };
    output(&mut admin("close-epoch"), "penrose-aggregator close-epoch")?;
    let bundle = dir.join("0001.bundle");
    let json = json_output(
        admin("export").arg("--out").arg(&bundle).arg("--json"),
        "penrose-aggregator export",
    )?;
    let evidence = dir.join("0001.evidence");
    let evidence_json = json_output(
        admin("export-evidence")
            .args(["--seq", "1", "--out"])
            .arg(&evidence)
            .arg("--json"),
        "penrose-aggregator export-evidence",
    )?;
    Ok(Exported {
        bundle,
        json,
        evidence,
        evidence_json,
    })
}

/// What the design server's part of the release produced.
pub(super) struct Decrypted {
    /// `report --json`: the design server's own report type.
    pub report: Report,
    /// What the release auditor did.
    pub audited: Audited,
    /// The architects' page (`report --html`).
    pub html: PathBuf,
}

/// What the release auditor's part of a run works with: the dealer's key folder, the
/// aggregation server's data directory (its signing key), the design server's archive and the
/// evidence issuer's key ring.
pub(super) struct AuditorParts<'a> {
    pub keys: &'a Path,
    pub agg: &'a DataDir,
    pub archive: &'a Path,
    pub evidence_ring: &'a Path,
}

/// The design server imports the bundle and its evidence into its archive (`parts.archive`),
/// the release auditor answers, the aggregation server forgets the evidence, and the design
/// server decrypts: as JSON, and as the architects' page, which must show the decrypted
/// histograms.
pub(super) fn decrypt(
    (options, bins, dir): (&Options, &Bins, &Path),
    parts: &AuditorParts<'_>,
    exported: &Exported,
    children: &mut Children,
    stages: &mut Stages,
) -> Result<Decrypted> {
    let t = Instant::now();
    import_into_design(bins, parts, &exported.bundle, &exported.evidence)?;
    let mut audited = release_auditor((options, bins, dir), parts, children)?;
    options.say(&audited.said);
    audited.rows_forgotten = forget_evidence(bins, parts.agg)?;
    let release = ["--threshold".to_string(), options.threshold.to_string()];
    let report_cmd = || {
        let mut cmd = bins.command("penrose-design");
        cmd.arg("report")
            .arg("--archive")
            .arg(parts.archive)
            .arg("--split-key")
            .arg(parts.keys)
            .args(&release);
        cmd
    };
    let report = json_output(report_cmd().arg("--json"), "penrose-design report")?;
    let html = report_page(report_cmd(), dir)?;
    stages.record("design server: import and decrypt", t);
    Ok(Decrypted {
        report,
        audited,
        html,
    })
}

/// The design server imports the bundle (pinning the aggregation server's key) and keeps its
/// evidence beside it.
fn import_into_design(
    bins: &Bins,
    parts: &AuditorParts<'_>,
    bundle: &Path,
    evidence: &Path,
) -> Result<()> {
    output(
        bins.command("penrose-design")
            .arg("import")
            .arg("--archive")
            .arg(parts.archive)
            .arg("--signer")
            .arg(parts.agg.signing_key().with_extension("key.pub"))
            .arg(bundle),
        "penrose-design import",
    )?;
    output(
        bins.command("penrose-design")
            .arg("import-evidence")
            .arg("--archive")
            .arg(parts.archive)
            .arg(evidence),
        "penrose-design import-evidence",
    )?;
    Ok(())
}

/// The auditor has answered bundle 1: its evidence can go (the server is stopped; the
/// command opens its data directory). The rows deleted.
fn forget_evidence(bins: &Bins, agg: &DataDir) -> Result<u64> {
    let forgot: ForgetEvidenceReply = json_output(
        bins.command("penrose-aggregator")
            .arg("forget-evidence")
            .arg("-d")
            .arg(agg.path())
            .args(["--through", "1", "--json"]),
        "penrose-aggregator forget-evidence",
    )?;
    Ok(forgot.rows)
}

/// The same release as the page architects read (`report` as `cmd` runs it, with `--html`
/// into `dir/html`); it must show the decrypted histograms. Its `index.html`.
fn report_page(mut cmd: Command, dir: &Path) -> Result<PathBuf> {
    let html_dir = dir.join("html");
    output(
        cmd.arg("--html").arg(&html_dir),
        "penrose-design report --html",
    )?;
    let html = html_dir.join("index.html");
    let page = std::fs::read_to_string(&html).context("reading the report page")?;
    ensure!(
        page.contains("<svg"),
        "the report page {} holds no plot",
        html.display()
    );
    Ok(html)
}

/// What the release auditor did.
pub(super) struct Audited {
    /// As said on screen.
    said: String,
    /// Partial decryptions it gave, and sums it withheld, per `penrose-design audit`.
    pub partials: u64,
    /// See `partials`.
    pub withheld: u64,
    /// Evidence tokens it counted (its `status`).
    pub tokens_counted: u64,
    /// Evidence rows the aggregation server deleted once the auditor had answered.
    pub rows_forgotten: u64,
}

/// The release auditor's part of a run: set up and started as its own process
/// ([`start_auditor`]) with the evidence issuer's key ring, so that it counts contributors
/// itself, asked by the design server for its partial decryptions of the archive
/// (`penrose-design audit`, pinning its certificate, forwarding each page's evidence),
/// stopped.
fn release_auditor(
    (options, bins, dir): (&Options, &Bins, &Path),
    parts: &AuditorParts<'_>,
    children: &mut Children,
) -> Result<Audited> {
    let (child, ready) =
        start_auditor(&bins.path("penrose-auditor"), dir, parts, options.threshold)?;
    let index = children.push("penrose-auditor", child);
    let address = ready.listening.to_string();
    let audited: AuditSummary = json_output(
        bins.command("penrose-design")
            .arg("audit")
            .arg("--archive")
            .arg(parts.archive)
            .args(["--auditor", &address])
            .arg("--auditor-cert")
            .arg(&ready.certificate)
            .arg("--json"),
        "penrose-design audit",
    )?;
    children.stop(index, Duration::from_secs(10))?;
    let status: penrose_auditor::AuditorStatus = json_output(
        bins.command("penrose-auditor")
            .arg("status")
            .arg("--data")
            .arg(dir.join("auditor"))
            .arg("--json"),
        "penrose-auditor status",
    )?;
    let (partials, withheld) = (audited.partials as u64, audited.withheld as u64);
    Ok(Audited {
        said: format!(
            "release auditor: on {address} as its own process, counting contributors from \
             evidence ({} tokens counted); {partials} partial decryptions given, {withheld} sums \
             withheld under its own k = {}",
            status.tokens_counted, options.threshold
        ),
        partials,
        withheld,
        tokens_counted: status.tokens_counted,
        rows_forgotten: 0,
    })
}

/// Sets up the release auditor (`penrose-auditor init` with the auditor's share, the
/// aggregation server's signing key and the run's threshold) in `dir/auditor` and starts it
/// on a free loopback port, its log in `dir/auditor.log`: the child, and its ready line (its
/// address and the certificate the design server pins).
fn start_auditor(
    bin: &Path,
    dir: &Path,
    parts: &AuditorParts<'_>,
    threshold: u64,
) -> Result<(Child, penrose_auditor::service::Listening)> {
    let data = dir.join("auditor");
    init_auditor(bin, &data, parts, threshold)?;
    let log = std::fs::File::create(dir.join("auditor.log"))?;
    let mut child = Command::new(bin)
        .arg("serve")
        .arg("--data")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting penrose-auditor serve")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("auditor stdout")?).read_line(&mut line)?;
    match serde_json::from_str(&line) {
        Ok(ready) => Ok((child, ready)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e).with_context(|| format!("the auditor's first line: {line:?}"))
        }
    }
}

/// `penrose-auditor init` in `data`, with the dealer's share (then deleted here) and its
/// party's token key ring.
fn init_auditor(bin: &Path, data: &Path, parts: &AuditorParts<'_>, threshold: u64) -> Result<()> {
    let keys = parts.keys;
    output(
        Command::new(bin)
            .arg("init")
            .arg("--data")
            .arg(data)
            .arg("--share")
            .arg(keys.join("auditor.share"))
            .arg("--public-key")
            .arg(keys.join("public.key"))
            .arg("--verification-key")
            .arg(keys.join("verification.key"))
            .arg("--aggregator-key")
            .arg(parts.agg.signing_key().with_extension("key.pub"))
            .args(["--threshold", &threshold.to_string()]),
        "penrose-auditor init",
    )?;
    // The dealer's copy goes once the auditor holds it.
    std::fs::remove_file(keys.join("auditor.share"))?;
    // Its party's token key ring: with it, the auditor counts every sum's contributors from
    // the evidence tokens the agents spent (0600, as the issuer exported it).
    std::fs::copy(parts.evidence_ring, data.join("evidence-keys"))?;
    std::fs::set_permissions(
        data.join("evidence-keys"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    Ok(())
}
