//! The run's two token issuers: the admission issuer, whose tokens the aggregation server
//! verifies, and the release auditor's party's evidence issuer, whose tokens only the auditor
//! can check.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use penrose_issuer::admin::Status;

use super::Options;
use super::process::{Bins, Children, Stages, json_output, output};

/// The issuer's state directory in a demo run's directory.
pub fn issuer_state(dir: &Path) -> PathBuf {
    dir.join("issuer")
}

/// Where one issuer of a run keeps its state, writes its hosts' credentials, exports its
/// key ring and logs; and its process's name among the run's children.
struct IssuerPaths {
    name: &'static str,
    state: PathBuf,
    credentials: PathBuf,
    ring: PathBuf,
    log: PathBuf,
}

/// One issuer, set up and serving.
pub(super) struct IssuerRun {
    /// Its state directory.
    state: PathBuf,
    /// Its process, in the run's children.
    index: usize,
    /// Its QUIC address.
    pub listen: String,
    /// Its certificate.
    pub cert: PathBuf,
    /// Its stream port (for Tor), or empty.
    pub stream: String,
    /// One credential file per host.
    pub credentials: Vec<PathBuf>,
    /// The key ring it exported.
    pub ring: PathBuf,
    /// What `export-keys --json` said.
    exported: KeysWritten,
}

/// One row of `penrose-issuer enrol --json`: what the demo reads of it. The issuer prints
/// it from a type of its binary (`Enrolled` in its `main.rs`), which no library exports, so
/// the demo reads the one field it needs into this mirror.
#[derive(serde::Deserialize)]
struct Enrolled {
    file: PathBuf,
}

/// `penrose-issuer export-keys --json`: what the demo reads of it. A mirror, like
/// [`Enrolled`]: the issuer prints it from a type of its binary (`Written`).
#[derive(serde::Deserialize)]
struct KeysWritten {
    from_date: String,
    to_date: String,
}

/// Both issuers of a run, serving.
pub(super) struct Issuers {
    /// The admission issuer; its key ring goes to the aggregation server.
    pub admission: IssuerRun,
    /// The release auditor's party's; its key ring goes to the auditor alone.
    pub evidence: IssuerRun,
}

/// Each issuer: its state, a credential per host, its key ring; then it serves. The release
/// auditor's party runs an issuer of its own: its own enrolment (a second credential per
/// host), its own keys, which only the auditor gets (contributor evidence).
pub(super) fn start_issuers(
    (options, bins, dir): (&Options, &Bins, &Path),
    host_count: usize,
    children: &mut Children,
    stages: &mut Stages,
) -> Result<Issuers> {
    let t = Instant::now();
    let set_up = |name, state, credentials: &str, ring: &str, log: &str| IssuerPaths {
        name,
        state,
        credentials: dir.join(credentials),
        ring: dir.join(ring),
        log: dir.join(log),
    };
    let paths = set_up(
        "penrose-issuer",
        issuer_state(dir),
        "credentials",
        "aggregator-token-keys",
        "issuer.log",
    );
    let admission = set_up_issuer(bins, &paths, (host_count, options.tor), children)?;
    let paths = set_up(
        "penrose-issuer (evidence)",
        dir.join("evidence-issuer"),
        "evidence-credentials",
        "auditor-evidence-keys",
        "evidence-issuer.log",
    );
    let evidence = set_up_issuer(bins, &paths, (host_count, options.tor), children)?;
    stages.record("issuer: init, enrol, export keys, start", t);
    let issuers = Issuers {
        admission,
        evidence,
    };
    issuers.say(options, dir, host_count);
    Ok(issuers)
}

impl Issuers {
    fn say(&self, options: &Options, dir: &Path, host_count: usize) {
        let admission = &self.admission;
        options.say(&format!(
            "token issuer: listening on {} (QUIC){}, {host_count} hosts enrolled (one \
             credential file each, in {}); key ring of {} to {} exported to the aggregation \
             server",
            admission.listen,
            if options.tor {
                format!(" and {} (stream port, for Tor)", admission.stream)
            } else {
                String::new()
            },
            dir.join("credentials").display(),
            admission.exported.from_date,
            admission.exported.to_date,
        ));
        options.say(&format!(
            "evidence issuer (the release auditor's party): listening on {}, {host_count} hosts \
             enrolled with credentials of its own (in {}); its key ring goes to the auditor alone",
            self.evidence.listen,
            dir.join("evidence-credentials").display(),
        ));
    }

    /// Each issuer's own status type, which its `status --json` prints, read while it
    /// serves; then it is stopped.
    pub(super) fn stop(&self, bins: &Bins, children: &mut Children) -> Result<IssuerStatuses> {
        let admission = self
            .admission
            .stop(bins, children, "penrose-issuer status")?;
        let evidence = self
            .evidence
            .stop(bins, children, "penrose-issuer status (evidence)")?;
        Ok(IssuerStatuses {
            admission,
            evidence,
        })
    }
}

/// What both issuers said last.
pub(super) struct IssuerStatuses {
    pub admission: Status,
    pub evidence: Status,
}

impl IssuerRun {
    fn stop(&self, bins: &Bins, children: &mut Children, what: &str) -> Result<Status> {
        let status = json_output(
            bins.command("penrose-issuer")
                .arg("status")
                .arg("--state")
                .arg(&self.state)
                .arg("--json"),
            what,
        )?;
        children.stop(self.index, Duration::from_secs(30))?;
        Ok(status)
    }
}

/// `penrose-issuer init`, `enrol` (one credential per host), `export-keys` and `serve` (with a
/// stream port for Tor with `tor`), the process handed to `children`.
fn set_up_issuer(
    bins: &Bins,
    paths: &IssuerPaths,
    (host_count, tor): (usize, bool),
    children: &mut Children,
) -> Result<IssuerRun> {
    let bin = bins.path("penrose-issuer");
    let cmd = |command: &str| {
        let mut cmd = bins.command("penrose-issuer");
        cmd.arg(command).arg("--state").arg(&paths.state);
        cmd
    };
    output(&mut cmd("init"), "penrose-issuer init")?;
    let enrolled: Vec<Enrolled> = json_output(
        cmd("enrol")
            .args(["--count", &host_count.to_string(), "--out-dir"])
            .arg(&paths.credentials)
            .arg("--json"),
        "penrose-issuer enrol",
    )?;
    let credentials: Vec<PathBuf> = enrolled.into_iter().map(|e| e.file).collect();
    ensure!(
        credentials.len() == host_count,
        "penrose-issuer enrol wrote {} credentials for {host_count} hosts",
        credentials.len()
    );
    let exported: KeysWritten = json_output(
        cmd("export-keys")
            .arg("--out")
            .arg(&paths.ring)
            .arg("--json"),
        "penrose-issuer export-keys",
    )?;
    let (child, ready) = super::start_issuer(&bin, &paths.state, &paths.log, tor)?;
    let index = children.push(paths.name, child);
    let stream = match tor {
        true => ready
            .stream_listening
            .context("the issuer's stream port (--stream-listen)")?
            .to_string(),
        false => String::new(),
    };
    Ok(IssuerRun {
        state: paths.state.clone(),
        index,
        listen: ready.listening.to_string(),
        cert: ready.certificate,
        stream,
        credentials,
        ring: paths.ring.clone(),
        exported,
    })
}
