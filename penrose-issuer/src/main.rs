//! `penrose-issuer`: parses the command line (its definition is `penrose_issuer::cli`) and runs
//! it.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use penrose_core::calendar::date_of;
use penrose_core::wire::Day;
use penrose_host::clock::{Clock, SystemClock};
use penrose_host::durable::Access;
use penrose_host::exit::{Exit, finish};
use penrose_issuer::admin::{self, ENROL_CHUNK, Reply, Request, Status};
use penrose_issuer::cli::{Cli, Command};
use penrose_issuer::credential::{self, CredentialId};
use penrose_issuer::keys::{self, PublishWindow, Published};
use penrose_issuer::service::{self, ServeOptions};
use penrose_issuer::{IssuerConfig, IssuerError, MasterSeed, StateDir};
use serde::Serialize;

fn main() -> ExitCode {
    penrose_host::process::init_logging("info");
    let runtime = match penrose_host::exit::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return Exit::Failure.into();
        }
    };
    finish(runtime.block_on(run(Cli::parse())), exit_code)
}

/// The shared table (`penrose_host::exit`): a refused request (revoke: no such credential; a
/// bad label) is [`Exit::Refused`], a state directory another process holds
/// [`Exit::Unavailable`].
fn exit_code(e: &anyhow::Error) -> Exit {
    match e.downcast_ref::<IssuerError>() {
        Some(typed) if typed.is_refusal() => Exit::Refused,
        Some(IssuerError::Busy(_)) => Exit::Unavailable,
        _ => Exit::Failure,
    }
}

/// Prints `value` as pretty JSON with `--json`, else the text `text` makes of it.
fn print<T: Serialize>(json: bool, value: &T, text: impl FnOnce(&T) -> String) -> Result<()> {
    Ok(penrose_host::output::print_with(value, json, text)?)
}

#[derive(Serialize)]
struct Enrolled {
    id: String,
    short_id: String,
    file: String,
}

#[derive(Serialize)]
struct Written {
    file: String,
    from: u32,
    to: u32,
    from_date: String,
    to_date: String,
    keys: usize,
    key_set_digest: String,
}

async fn run(cli: Cli) -> Result<Exit> {
    let today = SystemClock.today();
    match cli.command {
        Command::Init { state, json } => init(&state.dir(), json)?,
        Command::Enrol {
            state,
            out,
            count,
            out_dir,
            label,
            json,
        } => enrol_command(&state.dir(), today, (out, count, out_dir), label, json).await?,
        Command::Revoke {
            state,
            id,
            credential,
            json,
        } => revoke(&state.dir(), today, id, credential, json).await?,
        Command::Serve {
            state,
            listen,
            stream_listen,
            cert,
            key,
            name,
            tokens_per_epoch,
            requests_per_hour,
            connections_per_source,
            new_connections_per_source,
        } => {
            let mut options = ServeOptions::new(state.dir(), listen);
            options.stream_listen = stream_listen;
            options.config = IssuerConfig::new(tokens_per_epoch, requests_per_hour)?;
            options.tls = cert.zip(key);
            options.names = name;
            set_source_limits(
                &mut options,
                connections_per_source,
                new_connections_per_source,
            )?;
            service::run(options).await?;
        }
        Command::KeySet {
            state,
            out,
            day,
            json,
        } => key_set(&state.dir(), &out, day.resolve(today), json)?,
        Command::ExportKeys {
            state,
            out,
            from,
            to,
            json,
        } => export_keys(
            &state.dir(),
            &out,
            (from.resolve(today), to.resolve(today)),
            today,
            json,
        )?,
        Command::Status { state, json } => {
            let reply = admin::run(&state.dir(), today, &Request::Status).await?;
            let Reply::Status(status) = reply else {
                bail!("the issuer answered status with {reply:?}");
            };
            print(json, &status, print_status)?;
        }
    }
    Ok(Exit::Success)
}

/// `enrol`: the label checked before anything is made, then one credential file per host.
async fn enrol_command(
    dir: &StateDir,
    today: Day,
    (out, count, out_dir): (Option<PathBuf>, Option<u32>, Option<PathBuf>),
    label: Option<String>,
    json: bool,
) -> Result<()> {
    if let Some(label) = &label {
        penrose_issuer::store::CredentialRecord::check_label(label)?;
    }
    let (files, named_by_id) = credential_files(out, count, out_dir)?;
    let enrolled = enrol(dir, today, &files, named_by_id, label).await?;
    print(json, &enrolled, |list| {
        let mut text = String::new();
        for e in list {
            let _ = writeln!(text, "{}  {}", e.short_id, e.file);
        }
        let _ = writeln!(
            text,
            "enrolled {} credential(s); install each file with the agent of its host",
            list.len()
        );
        text
    })
}

/// The per-source connection limits `serve` was given.
fn set_source_limits(
    options: &mut ServeOptions,
    connections_per_source: Option<usize>,
    new_connections_per_source: Option<u32>,
) -> Result<()> {
    if let Some(max) = connections_per_source {
        if max == 0 {
            bail!("--connections-per-source must be at least 1");
        }
        options.limits.max_connections_per_source = max;
    }
    if let Some(rate) = new_connections_per_source {
        options.limits.new_connections_per_source_per_second = NonZeroU32::new(rate);
    }
    Ok(())
}

fn init(dir: &StateDir, json: bool) -> Result<()> {
    let made = admin::init(dir)?;
    print(json, &made, |m| {
        let mut text = String::new();
        let _ = writeln!(text, "initialised {}", m.state.display());
        let _ = writeln!(
            text,
            "  master seed  {} (0600; back it up, keep it secret)",
            m.seed.display()
        );
        let _ = writeln!(text, "  store        {}", m.store.display());
        let _ = writeln!(
            text,
            "next: enrol hosts (penrose-issuer enrol), export the aggregation server's \
             keys (penrose-issuer export-keys), serve (penrose-issuer serve)"
        );
        text
    })
}

/// Where `enrol` writes credentials: the one `--out` file, or `--count` files in `--out-dir`
/// (created 0700), named by their ids once made (then the second value is true).
fn credential_files(
    out: Option<PathBuf>,
    count: Option<u32>,
    out_dir: Option<PathBuf>,
) -> Result<(Vec<PathBuf>, bool)> {
    match (out, count, out_dir) {
        (Some(out), _, _) => Ok((vec![out], false)),
        (None, count, Some(out_dir)) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&out_dir)
                .with_context(|| format!("creating {}", out_dir.display()))?;
            // Named by their ids once made; the directory stands for each of them.
            Ok((vec![out_dir; count.unwrap_or(1) as usize], true))
        }
        (None, _, None) => bail!("give --out FILE or --out-dir DIR"),
    }
}

async fn revoke(
    dir: &StateDir,
    today: Day,
    id: Option<String>,
    credential: Option<PathBuf>,
    json: bool,
) -> Result<()> {
    let id = match (id, credential) {
        (Some(id), _) => id,
        (None, Some(file)) => CredentialId::of(&credential::read_file(&file)?).to_string(),
        (None, None) => bail!("give the credential's id or --credential FILE"),
    };
    let reply = admin::run(dir, today, &Request::Revoke { id }).await?;
    print(json, &reply, |reply| {
        let mut text = String::new();
        if let Reply::Revoked {
            short_id,
            already,
            label,
            ..
        } = reply
        {
            let label = label
                .as_deref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default();
            if *already {
                let _ = writeln!(text, "{short_id}{label} was revoked already");
            } else {
                let _ = writeln!(text, "revoked {short_id}{label}");
            }
        }
        text
    })
}

fn key_set(dir: &StateDir, out: &Path, day: Day, json: bool) -> Result<()> {
    let seed = MasterSeed::load(&dir.seed())?;
    let published = Published::of(&seed, PublishWindow::default(), day)?;
    penrose_host::durable::replace(out, &published.encoded, Access::Public)?;
    let (from, to) = PublishWindow::default().range(day);
    let written = written(out, from, to, published.set.entries().len(), &published);
    print(json, &written, |w| {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "wrote the key set of {} ({} keys, {} to {}) to {}",
            date_of(day),
            w.keys,
            w.from_date,
            w.to_date,
            w.file
        );
        let _ = writeln!(text, "sha-256 {}", w.key_set_digest);
        text
    })
}

fn export_keys(
    dir: &StateDir,
    out: &Path,
    (from, to): (Day, Day),
    today: Day,
    json: bool,
) -> Result<()> {
    let seed = MasterSeed::load(&dir.seed())?;
    let ring = keys::key_ring(&seed, from, to)?;
    penrose_host::durable::replace(out, &ring.encode(), Access::Owner)?;
    let published = Published::of(&seed, PublishWindow::default(), today)?;
    let written = written(out, from, to, ring.keys().len(), &published);
    print(json, &written, |w| {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "wrote {} secret keys ({} to {}, every counter) to {} (0600)",
            w.keys, w.from_date, w.to_date, w.file
        );
        let _ = writeln!(
            text,
            "give it to the aggregation server; export the next range before {}",
            w.to_date
        );
        text
    })
}

fn written(file: &Path, from: Day, to: Day, keys: usize, published: &Published) -> Written {
    Written {
        file: file.display().to_string(),
        from: from.0,
        to: to.0,
        from_date: date_of(from),
        to_date: date_of(to),
        keys,
        key_set_digest: penrose_core::hex::encode(&published.set.digest()),
    }
}

/// Enrols one credential per file of `files`; with `named_by_id` each is a directory and the
/// file in it is named by the credential's short id.
async fn enrol(
    state: &penrose_issuer::StateDir,
    today: Day,
    files: &[PathBuf],
    named_by_id: bool,
    label: Option<String>,
) -> Result<Vec<Enrolled>> {
    let mut enrolled = Vec::new();
    let mut written = Vec::new();
    for target in files {
        let secret = credential::generate();
        let id = CredentialId::of(&secret);
        let file = if named_by_id {
            target.join(format!("{}.credential", id.short()))
        } else {
            target.clone()
        };
        // The file first: an enrolment whose file could not be written would be a credential
        // nobody holds.
        credential::write_file(&file, &secret)?;
        written.push(file.clone());
        enrolled.push(Enrolled {
            id: id.to_string(),
            short_id: id.short(),
            file: file.display().to_string(),
        });
    }
    for chunk in enrolled.chunks(ENROL_CHUNK) {
        let request = Request::Enrol {
            ids: chunk.iter().map(|e| e.id.clone()).collect(),
            label: label.clone(),
        };
        if let Err(e) = admin::run(state, today, &request).await {
            // Files of credentials not enrolled are removed; earlier chunks stay enrolled.
            let done = enrolled.len() - written.len();
            for file in &written {
                let _ = std::fs::remove_file(file);
            }
            return Err(anyhow::Error::new(e).context(format!(
                "enrolling (credentials enrolled before the failure: {done})"
            )));
        }
        written.drain(..chunk.len());
    }
    Ok(enrolled)
}

fn print_status(status: &Status) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "issuer {} ({}), today {} (day {})",
        status.state.display(),
        if status.serving {
            "serving"
        } else {
            "not serving"
        },
        status.date,
        status.today
    );
    let _ = writeln!(
        text,
        "credentials: {} enrolled, {} revoked",
        status.enrolled, status.revoked
    );
    if status.epochs.is_empty() {
        let _ = writeln!(
            text,
            "no tokens issued in the days kept (from day {})",
            status.prune_floor
        );
    } else {
        let _ = writeln!(
            text,
            "{:>10} {:>8} {:>10} {:>12}",
            "date", "day", "tokens", "credentials"
        );
        for epoch in &status.epochs {
            let _ = writeln!(
                text,
                "{:>10} {:>8} {:>10} {:>12}",
                epoch.date, epoch.epoch, epoch.tokens, epoch.credentials
            );
        }
    }
    if let Some(stats) = &status.since_start {
        let _ = writeln!(
            text,
            "since start: {} key set requests, {} issue requests, {} tokens issued; refused: {} \
             unknown credential, {} rate limited, {} malformed, {} unavailable; batches over \
             quota {}, unknown key {}, invalid {}",
            stats.key_set_requests,
            stats.issue_requests,
            stats.tokens_issued,
            stats.refused_unknown_credential,
            stats.refused_rate_limited,
            stats.refused_malformed,
            stats.refused_unavailable,
            stats.batches_quota,
            stats.batches_unknown_key,
            stats.batches_invalid
        );
    }
    text
}
