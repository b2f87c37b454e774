//! `penrose-aggregator`: parses the command line (its definition is `penrose_aggregator::cli`)
//! and runs it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use penrose_aggregator::admission::{Admission, AdmissionDescription, TokenRing};
use penrose_aggregator::cli::{Cli, Command, DataArg, Invocation, ReleaseArgs};
use penrose_aggregator::control::reply::{
    AdmissionStatus, BackupReply, CloseEpochsReply, EvidenceReply, ExportReply,
    ForgetEvidenceReply, ReloadKeysReply, StatusReply, ThrottleReply, TopReply,
};
use penrose_aggregator::control::{self, Request, Response};
use penrose_aggregator::ingest::IngestConfig;
use penrose_aggregator::output::{BundleSummary, FrameCheck, FrameVerdict, VerifyOutput};
use penrose_aggregator::serve;
use penrose_aggregator::store::StoreError;
use penrose_aggregator::validate::validate_frame;
use penrose_core::bundle::Bundle;
use penrose_core::wire;
use penrose_host::exit::{Exit, finish};

/// The server allocates and frees a frame, a validated report and a write batch's rows per
/// report on several threads; mimalloc's per-thread free lists do that without the
/// lock, consolidation and page faults glibc's malloc showed in profiles (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    penrose_host::process::init_logging("info");
    let runtime = match penrose_host::exit::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return Exit::Failure.into();
        }
    };
    let result = runtime.block_on(dispatch(penrose_aggregator::cli::parse()));
    finish(result, exit_code)
}

/// The shared table (`penrose_host::exit`): a data directory another process holds is
/// [`Exit::Unavailable`]; refused inputs (`check-reports`, `verify`) end with
/// [`Exit::Refused`] as their result, not as an error.
fn exit_code(e: &anyhow::Error) -> Exit {
    let busy = e.chain().any(|cause| {
        cause
            .downcast_ref::<StoreError>()
            .is_some_and(StoreError::is_busy)
    });
    if busy {
        Exit::Unavailable
    } else {
        Exit::Failure
    }
}

async fn dispatch(invocation: Invocation) -> Result<ExitCode> {
    match invocation {
        Invocation::Product(cli) => run(cli).await.map(ExitCode::from),
        #[cfg(feature = "test-util")]
        Invocation::Loadgen(args) => penrose_aggregator::loadgen::run(args).await,
    }
}

async fn run(cli: Cli) -> Result<Exit> {
    match cli.command {
        Command::CheckReport {
            key,
            token_keys,
            files,
            json,
        } => check_reports(&key, token_keys.as_deref(), &files, json),
        Command::Serve(args) => {
            serve::run(penrose_aggregator::settings::serve_options(args)?).await?;
            Ok(Exit::Success)
        }
        Command::Status { data, json } => status(&data, json).await,
        Command::ReloadKeys { data, json } => reload_keys(&data, json).await,
        Command::Top { data, limit, json } => top(&data, limit, json).await,
        Command::Throttle { data, rate, json } => throttle(&data, &rate, json).await,
        Command::Compact { data } => {
            admin(&data, Request::Compact).await?;
            println!("compacted");
            Ok(Exit::Success)
        }
        Command::Backup { data, dir, json } => backup(&data, &dir, json).await,
        Command::ExportEvidence {
            data,
            seq,
            out,
            json,
        } => export_evidence(&data, seq, &out, json).await,
        Command::ForgetEvidence {
            data,
            through,
            json,
        } => forget_evidence(&data, through, json).await,
        Command::AdoptCopy { data, json } => adopt_copy(&data, json),
        Command::CloseEpoch { data, json } => close_epoch(&data, json).await,
        Command::Export {
            data,
            out,
            seq,
            release,
            json,
        } => export(&data, &out, seq, &release, json).await,
        Command::Verify {
            bundle,
            signer,
            json,
        } => verify(&bundle, signer.as_deref(), json),
    }
}

async fn status(data: &DataArg, json: bool) -> Result<Exit> {
    let status = StatusReply::try_from(admin(data, Request::Status).await?.reply)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_status(&status)?;
    }
    Ok(Exit::Success)
}

async fn reload_keys(data: &DataArg, json: bool) -> Result<Exit> {
    let (dir, _) = data.resolve()?;
    let Some(r) = control::request(&dir.control_socket(), &Request::ReloadKeys).await? else {
        bail!(
            "no server is running on {}; `serve` reads the key ring when it starts",
            dir.path().display()
        );
    };
    let reloaded = ReloadKeysReply::try_from(r.reply)?;
    if json {
        println!("{}", serde_json::to_string(&reloaded)?);
    } else {
        match &reloaded.admission {
            AdmissionDescription::Tokens {
                key_ring,
                keys,
                epochs,
                ..
            } => println!(
                "key ring {} reloaded: {keys} keys, epochs {}",
                key_ring
                    .as_deref()
                    .map_or("?".into(), |p| p.display().to_string()),
                json_list(epochs)
            ),
            // The server refuses to reload under open admission.
            AdmissionDescription::Open => println!("admission is open: no key ring"),
        }
    }
    Ok(Exit::Success)
}

async fn top(data: &DataArg, limit: usize, json: bool) -> Result<Exit> {
    let top = TopReply::try_from(admin(data, Request::Top { limit }).await?.reply)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&top)?);
    } else {
        println!(
            "{:>7} {:>10} {:>9} {:>6} {:>10}",
            "class", "reports", "snippets", "reps", "first day"
        );
        for row in &top.top {
            println!(
                "{:>7} {:>10} {:>9} {:>6} {:>10}",
                row.class, row.reports, row.snippets, row.representatives, row.first_seen_day
            );
        }
        println!("({} classes in all)", top.classes);
    }
    Ok(Exit::Success)
}

async fn throttle(data: &DataArg, rate: &str, json: bool) -> Result<Exit> {
    let permille = parse_rate(rate)?;
    let r = admin(data, Request::Throttle { permille }).await?;
    let throttle = ThrottleReply::try_from(r.reply)?;
    if json {
        println!("{}", serde_json::to_string(&throttle)?);
    } else {
        println!(
            "agents are asked for {:.1}% of their normal rate",
            f64::from(permille) / 10.0
        );
    }
    Ok(Exit::Success)
}

async fn close_epoch(data: &DataArg, json: bool) -> Result<Exit> {
    let r = admin_with(data, Request::CloseEpochs, &ReleaseArgs::default()).await?;
    let closed = CloseEpochsReply::try_from(r.reply)?;
    if json {
        println!("{}", serde_json::to_string(&closed)?);
    } else {
        if closed.closed.is_empty() {
            println!("no open epoch holds reports");
        }
        for e in &closed.closed {
            println!(
                "closed epoch {}: {} reports over {} day(s)",
                e.epoch, e.reports, e.days
            );
        }
    }
    Ok(Exit::Success)
}

async fn export(
    data: &DataArg,
    out: &Path,
    seq: Option<u64>,
    release: &ReleaseArgs,
    json: bool,
) -> Result<Exit> {
    let r = admin_with(data, Request::Export { seq }, release).await?;
    let exported = ExportReply::try_from(r.reply)?;
    if json {
        println!("{}", serde_json::to_string(&exported)?);
    }
    let (Some(bundle), Some(bytes)) = (&exported.bundle, r.payload) else {
        if !json {
            println!("no epoch closed since the last export; nothing written");
        }
        return Ok(Exit::Success);
    };
    penrose_host::durable::replace(out, &bytes, penrose_host::durable::Access::Public)?;
    if !json {
        println!(
            "{}: bundle {} of chain {}: epochs {}, {} sums released ({} reports), {} sums \
                     withheld under {} contributors ({} reports), {} bytes",
            out.display(),
            bundle.seq,
            bundle.instance,
            json_list(&bundle.epochs),
            bundle.entries,
            bundle.reports,
            bundle.withheld_sums,
            bundle.threshold,
            bundle.withheld_reports,
            exported.bytes,
        );
    }
    Ok(Exit::Success)
}

/// `export-evidence`: the server writes the file (it holds the store).
async fn export_evidence(data: &DataArg, seq: u64, out: &Path, json: bool) -> Result<Exit> {
    let out = std::path::absolute(out)?;
    let request = Request::Evidence { seq, out };
    let reply = EvidenceReply::try_from(admin(data, request).await?.reply)?;
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    } else {
        println!(
            "{}: evidence of bundle {}: {} entries, {} reports listed ({} with an evidence \
             token), {} bytes",
            reply.evidence.display(),
            reply.seq,
            reply.entries,
            reply.reports,
            reply.with_tokens,
            reply.bytes,
        );
    }
    Ok(Exit::Success)
}

/// `forget-evidence`: the server deletes the evidence of bundles 1 to `through`.
async fn forget_evidence(data: &DataArg, through: u64, json: bool) -> Result<Exit> {
    let request = Request::ForgetEvidence { through };
    let reply = ForgetEvidenceReply::try_from(admin(data, request).await?.reply)?;
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    } else {
        println!(
            "evidence of bundles 1 to {} deleted: {} rows of epochs {}",
            reply.through,
            reply.rows,
            json_list(&reply.epochs)
        );
    }
    Ok(Exit::Success)
}

/// Runs an admin request on the running server, or on the data directory when none runs.
async fn admin(data: &DataArg, request: Request) -> Result<Response> {
    admin_with(data, request, &ReleaseArgs::default()).await
}

/// `backup`: the store through the admin channel (a checkpoint made a new instance), then
/// the signing key beside it.
async fn backup(data: &DataArg, dir: &Path, json: bool) -> Result<Exit> {
    let target = std::path::absolute(dir)?;
    if target.exists() {
        bail!("{} exists; backups go to a new directory", target.display());
    }
    let (data_dir, _) = data.resolve()?;
    std::fs::create_dir_all(&target)?;
    let db = target.join("db");
    let reply = BackupReply::try_from(admin(data, Request::Backup { dir: db }).await?.reply)?;
    let key = data_dir.signing_key();
    let copy = target.join("server.key");
    std::fs::copy(&key, &copy).with_context(|| format!("copying {}", key.display()))?;
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    } else {
        println!(
            "backup written to {} (instance {}, copied from {}); {} epoch(s) it holds will \
             never be released from it",
            target.display(),
            reply.instance,
            reply.parent,
            reply.released_elsewhere.len()
        );
    }
    Ok(Exit::Success)
}

/// `adopt-copy`: a copied store made a new instance, offline (RocksDB's lock refuses a
/// directory a server holds).
fn adopt_copy(data: &DataArg, json: bool) -> Result<Exit> {
    let (dir, _) = data.resolve()?;
    if !dir.db().exists() {
        bail!(
            "{} holds no store (wrong --data-dir?)",
            dir.path().display()
        );
    }
    let store = penrose_aggregator::store::RocksStore::open(&dir.db()).with_context(|| {
        format!(
            "opening {} (is a server running on it?)",
            dir.db().display()
        )
    })?;
    penrose_aggregator::state::check_format(&store)?;
    if penrose_aggregator::copies::check_home(&store).is_ok() {
        bail!(
            "{} is in the directory it was created in: it is not a copy, and adopting it would \
             withhold its open epochs for nothing",
            dir.db().display()
        );
    }
    let new = penrose_aggregator::copies::make_new_instance(&store)?;
    let reply = BackupReply {
        backup: dir.db(),
        instance: new.instance.to_string(),
        parent: new.parent.to_string(),
        released_elsewhere: new.released_elsewhere.iter().map(|e| e.0).collect(),
    };
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    } else {
        println!(
            "{} is now instance {} (copied from {}); {} epoch(s) it holds will never be \
             released from it",
            reply.backup.display(),
            reply.instance,
            reply.parent,
            reply.released_elsewhere.len()
        );
    }
    Ok(Exit::Success)
}

/// [`admin`], with the release rule to apply when no server runs (a running server applies
/// its own).
async fn admin_with(data: &DataArg, request: Request, release: &ReleaseArgs) -> Result<Response> {
    let (dir, file) = data.resolve()?;
    if let Some(response) = control::request(&dir.control_socket(), &request).await? {
        return Ok(response);
    }
    if !dir.db().exists() {
        bail!(
            "{} holds no store (wrong --data-dir?)",
            dir.path().display()
        );
    }
    let (epochs, release) = release.resolve(&file)?;
    // Offline, nothing is ingested: admission does not apply.
    let (admin, writer) = serve::open(
        &dir,
        &serve::KeySource::Stored,
        IngestConfig::default(),
        epochs,
        release,
        Admission::Open,
    )?;
    let response = tokio::task::spawn_blocking(move || {
        let response = control::execute(&admin, &request);
        drop(admin);
        (response, writer.join())
    })
    .await?;
    response.1?;
    Ok(response.0?)
}

/// How `serve` admits reports: by tokens with a key ring, or open only when asked explicitly.
fn parse_rate(text: &str) -> Result<u16> {
    let text = text.trim();
    let permille = if let Some(p) = text.strip_suffix("permille") {
        p.trim().parse::<f64>()?
    } else if let Some(p) = text.strip_suffix('%') {
        p.trim().parse::<f64>()? * 10.0
    } else {
        text.parse::<f64>()? * 1000.0
    };
    if !(0.0..=1000.0).contains(&permille) {
        bail!("rate {text} is outside 0% to 100%");
    }
    Ok(permille.round() as u16)
}

/// `[1,2,3]`: a list as `status` and `export` have always printed it (as JSON).
fn json_list<T: std::fmt::Display>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(","))
}

/// A value, or `null` for none (as JSON).
fn or_null<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "null".to_string(), |v| v.to_string())
}

fn print_status(s: &StatusReply) -> Result<()> {
    println!("serving:              {}", s.serving);
    println!("healthy:              {}", s.healthy);
    let covered = |yes: bool| if yes { "covered" } else { "NOT COVERED" };
    match &s.admission {
        Some(AdmissionStatus {
            admission:
                AdmissionDescription::Tokens {
                    key_ring,
                    keys,
                    epochs,
                    covers_today,
                    covers_tomorrow,
                },
            tokens_verified,
        }) => println!(
            "admission:            tokens (key ring {}, {keys} keys, epochs {}; today {}, \
             tomorrow {}; {tokens_verified} verified since start)",
            key_ring
                .as_deref()
                .map_or("?".into(), |p| p.display().to_string()),
            json_list(epochs),
            covered(*covers_today),
            covered(*covers_tomorrow),
        ),
        Some(AdmissionStatus {
            admission: AdmissionDescription::Open,
            ..
        }) => {
            println!("admission:            open (anyone who can reach the server can report)")
        }
        None => println!("admission:            (no server running)"),
    }
    println!("spent tokens (est.):  {}", or_null(s.spent_tokens));
    println!(
        "key id:               {}",
        s.key_id.as_deref().unwrap_or("none for today")
    );
    println!("reports accepted:     {}", s.reports_accepted_total);
    println!("classes:              {}", s.classes);
    println!(
        "new classes:          {} may be founded now, {} an hour",
        s.new_classes.available, s.new_classes.per_hour
    );
    println!("dedupe kept from day: {}", s.seen_floor_day);
    println!("snippets:             {}", s.snippets);
    println!("open accumulators:    {}", s.open_accumulators);
    println!("throttle:             {} permille", s.throttle_permille);
    println!("cursor:               {}", s.cursor);
    println!("table memory (est.):  {} bytes", s.table_heap_bytes);
    println!(
        "since start:          {}",
        serde_json::to_string(&s.since_start)?
    );
    for t in &s.store {
        println!(
            "store {:<6}          {} keys, {} bytes on disk, {} in memtables",
            t.table, t.keys, t.disk_bytes, t.memtable_bytes
        );
    }
    Ok(())
}

fn verify(path: &Path, signer: Option<&Path>, json: bool) -> Result<Exit> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let trusted = signer
        .map(penrose_host::key_file::read_signer)
        .transpose()?;
    let verdict = match Bundle::verify(&bytes, trusted.as_ref()) {
        Ok(b) => VerifyOutput::Valid(BundleSummary::new(&b, trusted.is_some())),
        Err(e) => VerifyOutput::Invalid {
            error: e.to_string(),
        },
    };
    if json {
        println!("{}", serde_json::to_string(&verdict)?);
    }
    match verdict {
        VerifyOutput::Valid(b) => {
            if !json {
                println!(
                    "{}: valid, signed by {}{}; bundle {} of chain {}, {} epochs, {} sums over {} \
                     classes, {} reports",
                    path.display(),
                    b.signer,
                    if b.pinned {
                        " (pinned)"
                    } else {
                        " (not pinned: pass --signer)"
                    },
                    b.seq,
                    b.instance,
                    b.epochs.len(),
                    b.entries,
                    b.classes,
                    b.reports,
                );
            }
            Ok(Exit::Success)
        }
        VerifyOutput::Invalid { error } => {
            if !json {
                println!("{}: INVALID: {error}", path.display());
            }
            Ok(Exit::Refused)
        }
    }
}

fn check_reports(
    key: &Path,
    token_keys: Option<&Path>,
    files: &[PathBuf],
    json: bool,
) -> Result<Exit> {
    let key = penrose_host::key_file::read_public_key(key)?;
    let keys = penrose_aggregator::design_keys::DesignKeys::single(key);
    let admission = match token_keys {
        Some(path) => Admission::Tokens(TokenRing::load(path)?),
        None => Admission::Open,
    };
    let today = penrose_host::clock::today();
    let mut rejected = 0usize;
    for file in files {
        let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let mut offset = 0;
        let mut index = 0;
        while offset < data.len() {
            let rest = &data[offset..];
            // A frame's extent comes from its prefix; a bad prefix ends the file's frames.
            let len = match wire::body_length(rest) {
                Ok(body) => (wire::LENGTH_PREFIX + body).min(rest.len()),
                Err(_) => rest.len(),
            };
            let verdict = match validate_frame(&rest[..len], &keys, today, &admission) {
                Ok(v) => FrameVerdict::Valid {
                    counter: v.report.counter.0,
                    samples: v.report.samples.0,
                },
                Err(e) => FrameVerdict::Rejected {
                    reason: format!("{:?}", e.reason()),
                    detail: e.to_string(),
                },
            };
            let check = FrameCheck {
                file: file.clone(),
                frame: index,
                offset,
                verdict,
            };
            if json {
                println!("{}", serde_json::to_string(&check)?);
            } else {
                match &check.verdict {
                    FrameVerdict::Valid { counter, samples } => println!(
                        "{}#{index}: valid (counter {counter}, {samples} samples)",
                        file.display(),
                    ),
                    FrameVerdict::Rejected { reason, detail } => {
                        println!("{}#{index}: rejected ({reason}): {detail}", file.display())
                    }
                }
            }
            if matches!(check.verdict, FrameVerdict::Rejected { .. }) {
                rejected += 1;
            }
            offset += len;
            index += 1;
        }
    }
    Ok(if rejected > 0 {
        Exit::Refused
    } else {
        Exit::Success
    })
}
