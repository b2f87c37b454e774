//! `serve`'s settings, checked once: each flag, else the configuration file's key, else the
//! default, made into the types the server runs on ([`ServeOptions`]: [`Limits`] with
//! `Duration`s and non-zero rates, [`IngestConfig`], the release rule, the admission). The
//! command line ([`crate::cli`]) only parses and the configuration file ([`crate::config`])
//! only reads; every range check is here, so a bad value is refused the same way whichever
//! of the two gave it.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use penrose_transport::Limits;

use crate::admission::AdmissionConfig;
use crate::cli::ServeArgs;
use crate::config::FileConfig;
use crate::ingest::IngestConfig;
use crate::serve::{KeySource, ServeOptions};

/// Where `serve` listens when neither a flag nor the file says.
const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4433);

/// The smallest UDP receive buffer worth asking the kernel for.
const MIN_UDP_RECEIVE_BUFFER: usize = 64 << 10;

/// The longest a handshake may be given, in seconds.
const MAX_HANDSHAKE_SECONDS: f64 = 60.0;

/// `serve`'s flags and configuration file, checked, as the options the server runs with.
pub fn serve_options(args: ServeArgs) -> Result<ServeOptions> {
    let (dir, file) = args.data.resolve()?;
    let (epochs, release) = args.release.resolve(&file)?;
    let admission = admission(
        args.token_keys.clone().or(file.token_keys.clone()),
        args.open_admission || file.open_admission == Some(true),
    )?;
    let limits = limits(&args, &file)?;
    let ingest = ingest(&args, &file)?;
    let tls = tls(&file)?;
    Ok(ServeOptions {
        data: dir,
        listen: args.listen.or(file.listen).unwrap_or(DEFAULT_LISTEN),
        stream_listen: args.stream_listen.or(file.stream_listen),
        keys: KeySource::new(
            args.public_key.or(file.public_key),
            args.key_list.or(file.key_list),
            args.key_list_signer.or(file.key_list_signer),
        )?,
        metrics: args.metrics.or(file.metrics),
        tls,
        ingest,
        limits,
        epochs,
        release,
        admission,
    })
}

/// Exactly one of a token key ring and open admission.
pub fn admission(token_keys: Option<PathBuf>, open: bool) -> Result<AdmissionConfig> {
    match (token_keys, open) {
        (Some(_), true) => bail!(
            "both a token key ring (token_keys, --token-keys) and open admission \
             (open_admission, --open-admission) are set; choose one"
        ),
        (Some(path), false) => Ok(AdmissionConfig::Tokens(path)),
        (None, true) => Ok(AdmissionConfig::Open),
        (None, false) => bail!(
            "no admission is configured: give the issuer's key ring (--token-keys PATH, or \
             token_keys in the configuration file) so that only reports with admission tokens \
             are counted, or --open-admission (open_admission = true) to let anyone who can \
             reach this server report"
        ),
    }
}

/// The transport's limits: connections, rates, the receive buffer, the handshake's time.
fn limits(args: &ServeArgs, file: &FileConfig) -> Result<Limits> {
    let mut limits = Limits::default();
    if let Some(max) = file.max_connections {
        limits.max_connections = max;
    }
    if let Some(bytes) = file.udp_receive_buffer {
        if bytes < MIN_UDP_RECEIVE_BUFFER {
            bail!("udp_receive_buffer must be at least 65536 bytes");
        }
        limits.udp_receive_buffer = bytes;
    }
    if let Some(rate) = args.reports_per_second.or(file.reports_per_second) {
        limits.reports_per_second = NonZeroU32::new(rate);
    }
    if let Some(max) = args
        .connections_per_source
        .or(file.max_connections_per_source)
    {
        if max == 0 {
            bail!("--connections-per-source must be at least 1");
        }
        limits.max_connections_per_source = max;
    }
    if let Some(rate) = args
        .new_connections_per_source
        .or(file.new_connections_per_source_per_second)
    {
        limits.new_connections_per_source_per_second = NonZeroU32::new(rate);
    }
    if let Some(seconds) = args.handshake_timeout.or(file.handshake_timeout) {
        if !(seconds > 0.0 && seconds <= MAX_HANDSHAKE_SECONDS) {
            bail!("--handshake-timeout must be more than 0 and at most 60 seconds");
        }
        limits.handshake_timeout = Duration::from_secs_f64(seconds);
    }
    Ok(limits)
}

/// Ingest: batch size, queue, the new-class budget, whether evidence is kept.
fn ingest(args: &ServeArgs, file: &FileConfig) -> Result<IngestConfig> {
    let defaults = IngestConfig::default();
    let new_classes_per_hour = match args.new_classes_per_hour.or(file.new_classes_per_hour) {
        Some(n) => NonZeroU32::new(n).context("--new-classes-per-hour must be at least 1")?,
        None => defaults.new_classes_per_hour,
    };
    Ok(IngestConfig {
        max_batch: args
            .max_batch
            .or(file.max_batch)
            .unwrap_or(defaults.max_batch),
        queue: file.queue.unwrap_or(defaults.queue),
        new_classes_per_hour,
        keep_evidence: args.keep_evidence || file.keep_evidence == Some(true),
    })
}

/// A certificate and key named together, or neither (the server makes its own).
fn tls(file: &FileConfig) -> Result<Option<(PathBuf, PathBuf)>> {
    match (&file.tls_cert, &file.tls_key) {
        (Some(c), Some(k)) => Ok(Some((c.clone(), k.clone()))),
        (None, None) => Ok(None),
        _ => bail!("tls_cert and tls_key go together"),
    }
}
