//! `penrose-design`: parses the command line (its definition is `penrose_design::cli`) and runs
//! it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use penrose_core::paillier::Keypair;
use penrose_core::release::ReleaseRule;
use penrose_design::archive::{self, Archive, Imported};
use penrose_design::cli::{Cli, Command};
use penrose_design::joint::Splits;
use penrose_design::key_list;
use penrose_design::keyfile;
use penrose_design::labels::Label;
use penrose_design::output::{
    BundleImport, ImportSummary, KeyInfo, KeyKind, Keygen, LabelRow, SplitFiles,
};
use penrose_design::report;
use penrose_design::{audit, evidence};
use penrose_host::clock::today;
use penrose_host::exit::{Exit, finish};

fn main() -> ExitCode {
    penrose_host::process::init_logging("error");
    finish(run(Cli::parse()).map(|()| Exit::Success), exit_code)
}

/// The shared table (`penrose_host::exit`): a bundle, audit answer or evidence file refused
/// is [`Exit::Refused`].
fn exit_code(e: &anyhow::Error) -> Exit {
    let refused = e
        .downcast_ref::<archive::ArchiveError>()
        .is_some_and(archive::ArchiveError::is_refusal)
        || e.downcast_ref::<audit::AuditError>()
            .is_some_and(audit::AuditError::is_refusal)
        || e.downcast_ref::<evidence::EvidenceError>()
            .is_some_and(evidence::EvidenceError::is_refusal);
    if refused {
        Exit::Refused
    } else {
        Exit::Failure
    }
}

fn keygen(out: &Path, split: bool, json: bool) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    tracing::info!(split, "generating a 2048-bit key pair");
    let keys = Keypair::generate(&mut rand::rng());
    let key_id = keys.public_key().key_id().to_string();
    let made = if split {
        let files = keyfile::write_split(out, &keys, &mut rand::rng())?;
        Keygen {
            key_id,
            private: None,
            public: files.public,
            split: Some(SplitFiles {
                design_share: files.design,
                auditor_share: files.auditor,
                verification_key: files.verification,
            }),
        }
    } else {
        let (private, public) = keyfile::write_keypair(out, &keys)?;
        Keygen {
            key_id,
            private: Some(private),
            public,
            split: None,
        }
    };
    if json {
        println!("{}", serde_json::to_string(&made)?);
        return Ok(());
    }
    println!("key id {}", made.key_id);
    if let Some(private) = &made.private {
        println!("private key: {} (mode 0600)", private.display());
    }
    println!("public key:  {}", made.public.display());
    if let Some(files) = &made.split {
        println!(
            "design share:     {} (mode 0600; stays here)",
            files.design_share.display()
        );
        println!(
            "auditor share:    {} (mode 0600; give it to the auditor's operator, then delete it here)",
            files.auditor_share.display()
        );
        println!("verification key: {}", files.verification_key.display());
    }
    Ok(())
}

fn audit(dir: &Path, auditor: std::net::SocketAddr, cert: &Path, json: bool) -> Result<()> {
    let archive = Archive::open(dir)?;
    let trust = penrose_transport::Trust::load_pinned(cert)
        .with_context(|| format!("reading the auditor's certificate {}", cert.display()))?;
    let mut config = penrose_transport::ClientConfig::new(auditor, "localhost", trust);
    // A page of partial decryptions takes the auditor seconds, not an ack's milliseconds.
    config.ack_timeout = std::time::Duration::from_secs(300);
    let client = penrose_transport::exchange::ExchangeClient::new(config, audit::PROTOCOL)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let summary = runtime.block_on(audit::fetch(&archive, &client))?;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{} bundles ({} with contributor evidence): {} pages asked ({} partial decryptions, \
             {} withheld by the auditor), {} already kept",
            summary.bundles,
            summary.bundles_with_evidence,
            summary.pages_asked,
            summary.partials,
            summary.withheld,
            summary.pages_kept
        );
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Keygen { out, split, json } => keygen(&out, split, json)?,
        Command::Audit {
            archive,
            auditor,
            auditor_cert,
            json,
        } => audit(&archive, auditor, &auditor_cert, json)?,
        Command::Import {
            archive,
            signer,
            new_chain,
            bundles,
            json,
        } => import(&archive, signer.as_deref(), new_chain, &bundles, json)?,
        Command::ImportEvidence {
            archive,
            files,
            json,
        } => import_evidence(&archive, &files, json)?,
        Command::Report {
            archive,
            key,
            split_key,
            threshold,
            reports_per_contributor,
            from,
            until,
            json,
            csv,
            csv_bins,
            csv_quadrants,
            splits,
            html,
            svg,
            png,
        } => {
            let rule = ReleaseRule::new(threshold, reports_per_contributor)?;
            let outputs = Outputs {
                format: Format::of(json, csv, csv_bins, csv_quadrants),
                splits: splits.into_iter().collect(),
                period: period_of(from, until)?,
                html: html.as_deref(),
                svg: svg.as_deref(),
                png: png.as_deref(),
            };
            print_report(&archive, &key, &split_key, rule, &outputs)?
        }
        Command::Label {
            archive,
            remove,
            class,
            label,
        } => set_label(&archive, class, if remove { None } else { label })?,
        Command::Labels { archive, json } => print_labels(&archive, json)?,
        Command::Simulate(args) => penrose_design::simulate::cli::main(&args)?,
        Command::KeyListSigner { out, json } => key_list_signer(&out, json)?,
        Command::KeyList {
            signing_key,
            keys,
            sequence,
            grace_days,
            out,
            json,
        } => write_key_list(&signing_key, &keys, sequence, grace_days, &out, json)?,
        Command::KeyInfo { file, json } => key_info(&file, json)?,
    }
    Ok(())
}

fn set_label(archive: &Path, class: u32, new: Option<Label>) -> Result<()> {
    let old = Archive::open(archive)?.set_label(class, new.clone())?;
    match (
        new.as_ref().map(Label::as_str),
        old.as_ref().map(Label::as_str),
    ) {
        (Some(l), Some(o)) => println!("class {class}: label {l:?} (was {o:?})"),
        (Some(l), None) => println!("class {class}: label {l:?}"),
        (None, Some(o)) => println!("class {class}: label {o:?} removed"),
        (None, None) => println!("class {class} had no label"),
    }
    Ok(())
}

fn print_labels(archive: &Path, json: bool) -> Result<()> {
    let rows = LabelRow::all(&Archive::open(archive)?.labels()?);
    if json {
        println!("{}", serde_json::to_string(&rows)?);
    } else {
        for row in &rows {
            println!("{}\t{}", row.class, row.label);
        }
    }
    Ok(())
}

fn key_list_signer(out: &Path, json: bool) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (secret, public) = key_list::create_signing_key(out)?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "signing_key": secret, "signer": public })
        );
    } else {
        println!("list-signing key: {} (mode 0600)", secret.display());
        println!(
            "pin on the aggregation server and the agents: {}",
            public.display()
        );
    }
    Ok(())
}

fn write_key_list(
    signing_key: &Path,
    keys: &[String],
    sequence: u64,
    grace_days: u8,
    out: &Path,
    json: bool,
) -> Result<()> {
    let today = today();
    let keys = keys
        .iter()
        .map(|k| parse_key_from(k, today))
        .collect::<Result<Vec<_>>>()?;
    let list = key_list::write_list(signing_key, &keys, sequence, grace_days, out)?;
    let schedule: Vec<serde_json::Value> = list
        .keys()
        .iter()
        .map(|k| {
            serde_json::json!({
                "from_day": k.from.0,
                "from": penrose_core::calendar::date_of(k.from),
                "key_id": k.key.key_id().to_string(),
            })
        })
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "list": out, "sequence": sequence, "grace_days": grace_days,
                "keys": schedule,
            })
        );
    } else {
        println!(
            "key list {} (sequence {sequence}, grace {grace_days} days)",
            out.display()
        );
        for k in list.keys() {
            println!(
                "  from {}: key {}",
                penrose_core::calendar::date_of(k.from),
                k.key.key_id()
            );
        }
    }
    Ok(())
}

fn key_info(file: &Path, json: bool) -> Result<()> {
    // Either kind of file; a private key is only read through the permission check.
    let (kind, key) = match keyfile::read_public_key(file) {
        Ok(public) => (KeyKind::Public, public),
        Err(keyfile::KeyFileError::Invalid { .. }) => (
            KeyKind::Private,
            keyfile::read_private_key(file)?.public_key().clone(),
        ),
        Err(e) => return Err(e.into()),
    };
    let info = KeyInfo {
        kind,
        key_id: key.key_id().to_string(),
        modulus_bits: key.size().modulus_bits(),
    };
    if json {
        println!("{}", serde_json::to_string(&info)?);
    } else {
        println!(
            "{} key, {}-bit modulus, key id {}",
            info.kind, info.modulus_bits, info.key_id
        );
    }
    Ok(())
}

/// `import-evidence`: each file kept beside the archived bundle it names.
fn import_evidence(dir: &Path, files: &[PathBuf], json: bool) -> Result<()> {
    let archive = Archive::open(dir)?;
    let mut imported = Vec::new();
    for path in files {
        let done = evidence::import(&archive, path)?;
        if !json {
            println!(
                "{}: evidence of bundle {} of chain {}, {} entries{}",
                path.display(),
                done.seq,
                done.instance,
                done.entries,
                if done.new { "" } else { " (kept already)" }
            );
        }
        imported.push(done);
    }
    if json {
        println!("{}", serde_json::to_string(&imported)?);
    }
    Ok(())
}

fn import(
    dir: &Path,
    signer: Option<&Path>,
    new_chain: bool,
    bundles: &[PathBuf],
    json: bool,
) -> Result<()> {
    let archive = Archive::open(dir)?;
    let signer = signer.map(archive::read_signer).transpose()?;
    let mut results = Vec::new();
    for path in bundles {
        let outcome = archive.import(path, signer.as_ref(), new_chain)?;
        match &outcome {
            Imported::New {
                instance,
                seq,
                epochs,
                entries,
                skipped_epochs,
            } => {
                tracing::info!(
                    "{}: imported bundle {seq} of chain {instance}: {epochs} epochs, {entries} sums",
                    path.display()
                );
                if !skipped_epochs.is_empty() {
                    tracing::warn!(
                        "{}: epochs {skipped_epochs:?} were already released by an earlier chain \
                         and are skipped",
                        path.display()
                    );
                }
            }
            Imported::AlreadyImported { instance, seq } => tracing::info!(
                "{}: bundle {seq} of chain {instance} was already imported (same bytes)",
                path.display()
            ),
        }
        results.push(BundleImport {
            bundle: path.clone(),
            outcome,
        });
    }
    let summary = ImportSummary::new(results, &archive.merged()?);
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "archive {}: {} bundles in {} chain(s), {} epochs, {} released sums",
            dir.display(),
            summary.bundles,
            summary.chains.len(),
            summary.epochs,
            summary.sums,
        );
    }
    Ok(())
}

/// The days `--from`/`--until` name (`None`: neither given, every epoch).
fn period_of(
    from: Option<penrose_core::calendar::DaySpec>,
    until: Option<penrose_core::calendar::DaySpec>,
) -> Result<Option<penrose_design::archive::Period>> {
    if from.is_none() && until.is_none() {
        return Ok(None);
    }
    let today = today();
    let first = from.map_or(penrose_core::wire::Day(0), |d| d.resolve(today));
    let last = until.map_or(today, |d| d.resolve(today));
    anyhow::ensure!(
        first <= last,
        "--from {} is after --until {}: the period is empty",
        penrose_core::calendar::date_of(first),
        penrose_core::calendar::date_of(last)
    );
    Ok(Some(penrose_design::archive::Period { first, last }))
}

/// One `--key FILE@DAY` of `key-list`.
fn parse_key_from(text: &str, today: penrose_core::wire::Day) -> Result<key_list::KeyFrom> {
    let (path, day) = text
        .rsplit_once('@')
        .with_context(|| format!("--key {text:?}: expected PUBLIC_KEY_FILE@DAY"))?;
    let day: penrose_core::calendar::DaySpec = day
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--key {text:?}: {e}"))?;
    Ok(key_list::KeyFrom {
        path: PathBuf::from(path),
        from: day.resolve(today),
    })
}

/// What `report` prints.
enum Format {
    Text,
    Json,
    Csv,
    CsvBins,
    CsvQuadrants,
}

impl Format {
    /// The format the flags ask for (clap lets at most one through).
    fn of(json: bool, csv: bool, csv_bins: bool, csv_quadrants: bool) -> Self {
        match (json, csv, csv_bins, csv_quadrants) {
            (true, ..) => Format::Json,
            (_, true, ..) => Format::Csv,
            (_, _, true, _) => Format::CsvBins,
            (_, _, _, true) => Format::CsvQuadrants,
            _ => Format::Text,
        }
    }
}

/// What `report` prints and writes.
struct Outputs<'a> {
    format: Format,
    splits: Splits,
    html: Option<&'a Path>,
    svg: Option<&'a Path>,
    png: Option<&'a Path>,
    /// The days the report covers (`None`: all).
    period: Option<penrose_design::archive::Period>,
}

/// Writes `text` to `dir/name`, creating `dir`.
fn write_file(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The keys `report` decrypts with: private keys whole, split keys by their directory.
fn holdings(keys: &[PathBuf], split: &[PathBuf]) -> Result<Vec<report::KeyHolding>> {
    let mut out = Vec::with_capacity(keys.len() + split.len());
    for k in keys {
        out.push(report::KeyHolding::Whole(keyfile::read_private_key(k)?));
    }
    for dir in split {
        let public = keyfile::read_public_key(&dir.join(keyfile::PUBLIC_KEY_FILE))?;
        let verification =
            keyfile::read_verification_key(&dir.join(keyfile::VERIFICATION_KEY_FILE), &public)?;
        let share = keyfile::read_design_share(&dir.join(keyfile::DESIGN_SHARE_FILE), &public)?;
        out.push(report::KeyHolding::Split {
            share,
            verification,
        });
    }
    Ok(out)
}

fn print_report(
    dir: &Path,
    keys: &[PathBuf],
    split: &[PathBuf],
    rule: ReleaseRule,
    outputs: &Outputs<'_>,
) -> Result<()> {
    let archive = Archive::open(dir)?;
    let merged = match outputs.period {
        Some(period) => archive.merged()?.within(period),
        None => archive.merged()?,
    };
    let keys = holdings(keys, split)?;
    let auditor = if split.is_empty() {
        audit::AuditorPartials::default()
    } else {
        audit::AuditorPartials::load(&archive)?
    };
    let mut report = report::build_with(&merged, &keys, &auditor, rule.threshold, rule.cap)?
        .covering(outputs.period);
    report.apply_labels(&archive.labels()?);
    report.apply_splits(&outputs.splits);
    write_report_files(&report, outputs)?;
    match outputs.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Csv => print!("{}", report::to_csv_table(&report)),
        Format::CsvBins => print!("{}", report::to_csv_bins(&report)),
        Format::CsvQuadrants => print!("{}", report::to_csv_quadrants(&report)),
        Format::Text => print_text(&report),
    }
    Ok(())
}

/// Every plot of `report`, by the file name it is written under (without the extension).
fn plots(report: &report::Report) -> Vec<(String, String)> {
    let overview = (
        "overview".to_string(),
        penrose_design::plot::overview(report),
    );
    let each = report.decrypted.iter().map(|c| {
        let label = c.label.as_ref().map(|l| l.as_str());
        let plot = match &c.joint {
            Some(j) => penrose_design::plot::heatmap(c, j, label),
            None => penrose_design::plot::histogram(c, label),
        };
        (
            format!("class-{}-{}-counter-{}", c.class, c.arch, c.counter),
            plot,
        )
    });
    std::iter::once(overview).chain(each).collect()
}

/// The HTML page and plot files `--html`, `--svg` and `--png` ask for.
fn write_report_files(report: &report::Report, outputs: &Outputs<'_>) -> Result<()> {
    if let Some(out) = outputs.html {
        let path = write_file(out, "index.html", &penrose_design::html::render(report))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(out) = outputs.svg {
        let plots = plots(report);
        for (name, plot) in &plots {
            write_file(out, &format!("{name}.svg"), plot)?;
        }
        eprintln!("wrote {} SVG files into {}", plots.len(), out.display());
    }
    if let Some(out) = outputs.png {
        write_pngs(report, out)?;
    }
    Ok(())
}

fn write_pngs(report: &report::Report, out: &Path) -> Result<()> {
    let raster = penrose_design::png::Rasteriser::with_system_fonts();
    if raster.fonts() == 0 {
        tracing::warn!(
            "no font under /usr/share/fonts: the PNG plots have no text (install \
             fonts-dejavu-core)"
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let plots = plots(report);
    for (name, plot) in &plots {
        let path = out.join(format!("{name}.png"));
        let png = raster
            .png(plot)
            .with_context(|| format!("drawing {}", path.display()))?;
        std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("wrote {} PNG files into {}", plots.len(), out.display());
    Ok(())
}

/// The report as text: what was decrypted under which rule, then one line per aggregate.
fn print_text(report: &report::Report) {
    print_summary(report);
    for c in &report.decrypted {
        print_decrypted(report, c);
    }
    for h in &report.held_back {
        println!(
            "class {:>4}{}  {:<7}  counter {:>3}: {} reports, at least {} contributors: under the threshold, not decrypted",
            h.class,
            label_of(report, h.class),
            h.arch,
            h.counter,
            h.reports,
            h.contributors_at_least
        );
    }
    for q in &report.quarantined {
        println!(
            "class {:>4}  {:<7}  counter {:>3}  epoch {} generation {}: QUARANTINED ({} reports): {}",
            q.class, q.arch, q.counter, q.epoch, q.generation, q.reports, q.reason
        );
    }
    for (chain, epoch) in &report.skipped_epochs {
        println!("epoch {epoch} of chain {chain}: skipped, an earlier chain released it");
    }
}

/// " (label)" of a labelled class, nothing for another.
fn label_of(report: &report::Report, class: u32) -> String {
    report
        .labels
        .get(&class)
        .map_or(String::new(), |l| format!(" ({l})"))
}

fn print_summary(report: &report::Report) {
    println!(
        "{} bundles, {} epochs; threshold k = {} contributors (T = {} reports per contributor and \
         day); {} (class, architecture, counter) aggregates decrypted in {} classes, {} held back, {} sums \
         ({} reports) quarantined; {} sums ({} reports) withheld by the aggregation server under its \
         threshold",
        report.bundles,
        report.epochs,
        report.threshold.get(),
        report.reports_per_contributor.get(),
        report.decrypted.len(),
        report.classes(),
        report.held_back.len(),
        report.quarantined.len(),
        report.quarantined.iter().map(|q| q.reports).sum::<u64>(),
        report.withheld_sums,
        report.withheld_reports,
    );
    println!("{}", report.admission_line());
    if let Some(period) = report.period {
        println!(
            "period {period}: the released epochs whose report days all lie within, added; an \
             aggregate's owners are the largest bound among the sums it adds"
        );
    }
    if !report.awaiting_auditor.is_empty() {
        println!(
            "{} sums ({} reports) await the release auditor's partial decryption (penrose-design audit)",
            report.awaiting_auditor.len(),
            report
                .awaiting_auditor
                .iter()
                .map(|q| q.reports)
                .sum::<u64>()
        );
    }
}

fn print_decrypted(report: &report::Report, c: &report::CounterReport) {
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    let head = format!(
        "class {:>4}{}  {:<7}  {:<22} {:>6} reports {:>4}+ owners {:>9} samples",
        c.class,
        c.label
            .as_ref()
            .map_or(String::new(), |l| format!(" ({l})")),
        c.arch,
        c.name,
        c.reports,
        c.contributors_at_least,
        c.samples,
    );
    match &c.joint {
        // A joint view has no mean or percentiles: its quadrants follow.
        Some(j) => println!("{head}  joint view of {} and {}:", j.x.counter, j.y.counter),
        None => println!(
            "{head}  mean {:>12}{u}  p50 {:>12}{u}  p90 {:>12}{u}  p99 {:>12}{u}",
            fmt(c.mean),
            fmt(c.p50),
            fmt(c.p90),
            fmt(c.p99),
            u = c.unit
        ),
    }
    if !c.merged_from.is_empty() {
        let merged: Vec<String> = c
            .merged_from
            .iter()
            .map(|&m| format!("{m}{}", label_of(report, m)))
            .collect();
        println!(
            "           (with classes {} that the aggregator merged into it)",
            merged.join(", ")
        );
    }
    if let Some(j) = &c.joint {
        print!("{j}");
    }
}
