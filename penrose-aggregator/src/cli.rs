//! The `penrose-aggregator` command line: its clap definition, here in the library so that
//! the binary parses it and `cargo xtask dist` renders man pages and shell completions from it.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};
use penrose_core::release::{ReportsPerContributor, Threshold};

use crate::config::{DataDir, FileConfig};
use crate::epochs::EpochPolicy;
use penrose_core::release::ReleaseRule;

/// The clap command of the product (the packages' man pages and completions are made from
/// it): never the test equipment's `loadgen`, whatever the build's features.
pub fn command() -> clap::Command {
    Cli::command()
}

/// What the process was asked to run.
pub enum Invocation {
    /// A product subcommand.
    Product(Cli),
    /// The load generator (test equipment, only with the `test-util` feature).
    #[cfg(feature = "test-util")]
    Loadgen(crate::loadgen::Args),
}

/// Parses the process's arguments (exiting with a usage message, code 2, when they do not
/// parse): the product's subcommands, and in a build with the `test-util` feature also
/// `loadgen`, which [`command`] never lists.
pub fn parse() -> Invocation {
    #[cfg(feature = "test-util")]
    return parse_with_test_equipment();
    #[cfg(not(feature = "test-util"))]
    Invocation::Product(Cli::parse())
}

#[cfg(feature = "test-util")]
fn parse_with_test_equipment() -> Invocation {
    use clap::{Args as _, FromArgMatches as _};
    let loadgen = crate::loadgen::Args::augment_args(clap::Command::new("loadgen").about(
        "Load generator (test equipment): many concurrent clients sending valid encrypted \
         reports built from the real traces' fingerprints, plus a share of invalid ones",
    ));
    let matches = command().subcommand(loadgen).get_matches();
    let parsed = match matches.subcommand() {
        Some(("loadgen", args)) => {
            crate::loadgen::Args::from_arg_matches(args).map(Invocation::Loadgen)
        }
        _ => Cli::from_arg_matches(&matches).map(Invocation::Product),
    };
    parsed.unwrap_or_else(|e| e.exit())
}

/// The Penrose aggregation server: validates encrypted reports and adds them up per
/// application class, without ever holding a private key.
///
/// Start it with `serve`; the other commands administer it. Admin commands talk to a running
/// server through the control socket in its data directory (DATA/control.sock); when no
/// server runs they open the data directory themselves, so they work the same either way.
///
/// Exit codes (every Penrose binary's): 0 success, 1 error, 2 usage, 3 refused (check-report:
/// some frame was rejected; verify: the bundle failed verification; the load generator of
/// test builds: some reports were refused), 4 unavailable (another process holds the data
/// directory).
#[derive(Parser)]
#[command(version, about, long_about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where the data directory is: `-d DATA`, or `data_dir` in the `-c` configuration file.
#[derive(clap::Args, Clone)]
pub struct DataArg {
    /// The data directory [default: from --config, else ./penrose-data].
    #[arg(long, short = 'd')]
    pub data_dir: Option<PathBuf>,
    /// Configuration file (TOML; see `serve --help`).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
}

impl DataArg {
    /// The data directory (the flag, else the file's `data_dir`, else `./penrose-data`) and the
    /// configuration file's contents (empty without `-c`).
    pub fn resolve(&self) -> Result<(DataDir, FileConfig)> {
        let file = match &self.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let dir = self
            .data_dir
            .clone()
            .or_else(|| file.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from("penrose-data"));
        Ok((DataDir::new(dir), file))
    }
}

/// The release rule's flags (`serve`, and `export` when no server runs).
#[derive(clap::Args, Clone, Default)]
pub struct ReleaseArgs {
    /// How epochs are cut: `day` or `reports:N` [default: as the store says; a new store: day].
    #[arg(long)]
    pub epochs: Option<EpochPolicy>,
    /// k, the fewest contributors a released sum has [default and floor: 10].
    #[arg(long)]
    pub threshold: Option<u64>,
    /// T, the most reports one agent sends per counter and day [default and floor: 24].
    #[arg(long)]
    pub reports_per_contributor: Option<u32>,
}

impl ReleaseArgs {
    /// The epoch policy and release rule: each flag, else the file's key, else the default.
    pub fn resolve(&self, file: &FileConfig) -> Result<(Option<EpochPolicy>, ReleaseRule)> {
        let epochs = match (&self.epochs, &file.epochs) {
            (Some(p), _) => Some(*p),
            (None, Some(text)) => Some(
                text.parse::<EpochPolicy>()
                    .map_err(|e| anyhow::anyhow!("configuration key epochs: {e}"))?,
            ),
            (None, None) => None,
        };
        let defaults = ReleaseRule::default();
        let threshold = match self.threshold.or(file.threshold) {
            Some(k) => Threshold::new(k)?,
            None => defaults.threshold,
        };
        let cap = match self
            .reports_per_contributor
            .or(file.reports_per_contributor)
        {
            Some(t) => ReportsPerContributor::for_servers(t)?,
            None => defaults.cap,
        };
        Ok((epochs, ReleaseRule { threshold, cap }))
    }
}

/// `serve`'s flags; each overrides the configuration file's key of the same meaning
/// ([`crate::settings::serve_options`] checks them all, once).
#[derive(clap::Args)]
pub struct ServeArgs {
    /// The data directory and configuration file.
    #[command(flatten)]
    pub data: DataArg,
    /// QUIC listen address (UDP) [default: 127.0.0.1:4433].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Also accept QUIC carried on TCP streams here: the port agents that send over Tor
    /// name as `transport.aggregator_stream`, reached by Tor exits [default: off].
    #[arg(long)]
    pub stream_listen: Option<SocketAddr>,
    /// The design server's public key file (`penrose-design keygen` writes it), used for
    /// every day. To roll keys over, give --key-list instead.
    #[arg(long, conflicts_with = "key_list")]
    pub public_key: Option<PathBuf>,
    /// The design server's signed key list (`penrose-design key-list` writes it): which
    /// key encrypts which day's reports, the replaced key accepted for its grace days.
    /// SIGHUP or `reload-keys` reads it again; agents fetch it from this server.
    #[arg(long, requires = "key_list_signer")]
    pub key_list: Option<PathBuf>,
    /// The design server's list-signing public key (`penrose-design key-list-signer`
    /// writes it): a list that does not verify under it is refused.
    #[arg(long, requires = "key_list")]
    pub key_list_signer: Option<PathBuf>,
    /// The admission key ring the issuer exported (mode 0600): admit only reports with a
    /// valid, unspent token of its keys.
    #[arg(long, conflicts_with = "open_admission")]
    pub token_keys: Option<PathBuf>,
    /// Admit reports without admission tokens: anyone who can reach this server can report
    /// (tests, demos, a fleet without an issuer). Required when --token-keys is not given.
    #[arg(long)]
    pub open_admission: bool,
    /// Prometheus metrics address (HTTP); none by default.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Most reports per durable write [default: 4096].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// New report streams per connection per second; 0 for no limit [default: 5000].
    #[arg(long)]
    pub reports_per_second: Option<u32>,
    /// Connections one source (IPv4 address, IPv6 /64) may have open at once
    /// [default: 512].
    #[arg(long)]
    pub connections_per_source: Option<usize>,
    /// New connections one source may open per second (also its burst); 0 for no limit
    /// [default: 500].
    #[arg(long)]
    pub new_connections_per_source: Option<u32>,
    /// Seconds a connection's handshake may take before it is abandoned and its slot given
    /// back [default: 5].
    #[arg(long)]
    pub handshake_timeout: Option<f64>,
    /// Most application classes founded per hour (a bucket that holds an hour's worth);
    /// a report whose snippet would found one beyond it is refused with new_class_limit
    /// and agents send it again later [default: 1000].
    #[arg(long)]
    pub new_classes_per_hour: Option<u32>,
    /// Keep every accepted report's binding and evidence token (about 1.4 KB a report), so
    /// that `export-evidence` can give the release auditor each released sum's reports to
    /// count contributors from [default: off; config: keep_evidence].
    #[arg(long)]
    pub keep_evidence: bool,
    /// The release rule.
    #[command(flatten)]
    pub release: ReleaseArgs,
}

/// The subcommands (each variant's doc comment is its help text; the type's own doc comment
/// is overridden by [`Cli`]'s).
#[derive(Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start, so serve's many flags cost nothing worth boxing"
)]
pub enum Command {
    /// Run the server: QUIC ingest, the writer, the admin socket and metrics.
    ///
    /// Flags override the configuration file, whose keys are: data_dir, listen, stream_listen, public_key,
    /// key_list, key_list_signer, token_keys, open_admission, metrics, tls_cert, tls_key, max_batch, queue, max_connections,
    /// max_connections_per_source, new_connections_per_source_per_second, handshake_timeout,
    /// reports_per_second, new_classes_per_hour, epochs, threshold, reports_per_contributor.
    ///
    /// Flood resistance: a connection attempt from an unvalidated address gets a QUIC Retry
    /// and holds nothing; one source (IPv4 address or IPv6 /64) may hold
    /// --connections-per-source connections and open --new-connections-per-source a second;
    /// a handshake gets --handshake-timeout; a report that would found a new class beyond
    /// --new-classes-per-hour is answered new_class_limit (agents keep it and retry).
    ///
    /// Release: every report joins one epoch (`--epochs day`, the default: its own day;
    /// `reports:N`: epochs of N reports). Only closed epochs are exported, and of them only the
    /// sums with at least --threshold contributors, counted as reports / (T x days) rounded
    /// up with T = --reports-per-contributor (agents send at most T per counter and day). k is
    /// at least 10 and T at least 24: both can only be raised.
    /// Admission: with --token-keys every report must carry an admission token of the
    /// issuer's key of its day and counter, bound to the report, spent once (refused:
    /// token_required, invalid_token, token_spent), verified before anything is stored. The key
    /// ring file (the issuer exports it ahead of time) must be readable by the server's user
    /// alone and not a symbolic link; SIGHUP or `reload-keys` reads it again. Without
    /// --token-keys the server refuses to start unless --open-admission says that anyone who
    /// can reach it may report.
    ///
    /// On first start it needs the design server's public key, creates the data directory
    /// (0700), a signing key for bundles (server.key, 0600) and, unless given one, a
    /// self-signed TLS certificate (tls/cert.pem) for agents to pin. It prints one JSON line
    /// with its addresses, then logs to stderr. SIGINT/SIGTERM stop it after the reports in
    /// flight are acked. Example:
    ///   penrose-aggregator serve -d /var/lib/penrose --public-key public.key \
    ///     --token-keys /etc/penrose/token-keys --metrics 127.0.0.1:9464
    Serve(ServeArgs),
    /// Counters, classes, accumulators, throttle and store sizes.
    Status {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The application classes with the most reports: the operator's everyday query.
    Top {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// How many classes.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask agents to upload at a share of their normal rate (every ack carries it).
    ///
    /// Example: `penrose-aggregator throttle --rate 80%` (also 0.8 or 800permille).
    Throttle {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// The rate: a percentage (80%), a fraction (0.8) or permille (800permille).
        #[arg(long)]
        rate: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Compact the store (reclaims space after many updates of the same sums).
    Compact {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
    },
    /// Write a consistent copy of the store to DIR while the server keeps serving.
    ///
    /// DIR must not exist. The signing key is copied with it (0600). Restore by pointing
    /// `serve --data-dir` at a directory holding DIR as `db` and the key as `server.key`.
    ///
    /// The copy is a new instance: its own bundle chain, and every epoch it holds (open ones
    /// included) is never released from it, since the original releases those. A restore
    /// therefore loses the reports of the epochs that were open at backup time.
    Backup {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// Target directory.
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a store copied around the product (cp -a, rsync, a file-level restore) a new
    /// instance, so that it may serve and export again.
    ///
    /// `serve` and `export` refuse a store found in another directory than the one it was
    /// created in, because a copy that released the epochs its original also releases would
    /// give two versions of one sum. This gives the copy its own bundle chain and marks every
    /// epoch it holds as released elsewhere: those reports are never released from here. Run
    /// it with no server on the directory. Example:
    ///   penrose-aggregator adopt-copy -d /var/lib/penrose
    AdoptCopy {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Close every open epoch that holds reports now, instead of waiting for its day to pass
    /// or its count to fill.
    ///
    /// Reports of a closed day that still arrive join the next open epoch (whose span then
    /// covers both days, which halves its contributor bound). Use it before a planned
    /// shutdown of a count-cut store, or in tests and demos. Example:
    ///   penrose-aggregator close-epoch -d /var/lib/penrose
    CloseEpoch {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the next signed bundle of the chain, while the server keeps serving.
    ///
    /// The bundle releases every epoch closed since the last export: per (class, counter,
    /// epoch) the encrypted sums whose contributor bound reaches the threshold, and per epoch
    /// how many sums and reports were withheld under it. Open epochs are never exported. The
    /// design server imports bundles in order (`penrose-design import`); when no epoch closed
    /// since the last export nothing is written (exit 0, `"exported": false` with --json).
    /// A lost bundle file can be written again, byte for byte, with --seq. Examples:
    ///   penrose-aggregator export -d /var/lib/penrose --out 0007.bundle
    ///   penrose-aggregator export -d /var/lib/penrose --out 0003.bundle --seq 3
    Export {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// Where to write the bundle.
        #[arg(long)]
        out: PathBuf,
        /// Write bundle SEQ of the chain again instead of the next one.
        #[arg(long)]
        seq: Option<u64>,
        /// The release rule.
        #[command(flatten)]
        release: ReleaseArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the contributor evidence of an exported bundle, for the release auditor.
    ///
    /// Per entry of bundle SEQ, in order, every report the server kept for the sums it adds
    /// up (`serve --keep-evidence`): each report's bytes and the evidence token it carried.
    /// The auditor counts the sum's contributors from those tokens, which this server can
    /// neither make nor move, and checks that the reports multiply to the released sum. The
    /// file is written by the server (running or not), whole or not at all. Example:
    ///   penrose-aggregator export-evidence -d /var/lib/penrose --seq 7 --out 0007.evidence
    ExportEvidence {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// The bundle.
        #[arg(long)]
        seq: u64,
        /// Where to write the evidence.
        #[arg(long)]
        out: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete the contributor evidence of bundles the release auditor has answered.
    ///
    /// Every evidence row of the epochs released in bundles 1 to --through (withheld sums'
    /// included: a closed epoch is never released again), about 1.4 KB a report. Run it once
    /// the auditor has answered bundle --through (`penrose-design audit` got its partials);
    /// `export-evidence` of those bundles then lists no reports. Example:
    ///   penrose-aggregator forget-evidence -d /var/lib/penrose --through 7
    ForgetEvidence {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// The last bundle the auditor answered.
        #[arg(long)]
        through: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a bundle's signature and structure, and summarise it.
    Verify {
        /// The bundle file.
        bundle: PathBuf,
        /// The aggregation server's public signing key (hex, as in DATA/server.key.pub);
        /// without it, only the bundle's own signer is checked.
        #[arg(long)]
        signer: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read the admission key ring file again (a running server admitting by tokens; SIGHUP
    /// does the same). The ring in use stays when the file is refused.
    ///
    /// The issuer exports rings ahead of time (keys of the coming days); replace the file
    /// (keeping mode 0600) and run this. Example:
    ///   penrose-aggregator reload-keys -c /etc/penrose/aggregator.toml
    ReloadKeys {
        /// The data directory and configuration file.
        #[command(flatten)]
        data: DataArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check report frames saved to files, exactly as the server checks what it receives.
    ///
    /// Each file holds one or more length-delimited frames back to back. Every frame is
    /// decoded and validated against the public key (format version, sizes, key id, counter
    /// catalogue, sample count, ciphertext range and unit check) and, with --token-keys, its
    /// admission token (not whether it was spent). Example:
    ///   penrose-aggregator check-report --key public.key captured.frames
    CheckReport {
        /// The design server's public key file (`penrose-design keygen` writes it).
        #[arg(long)]
        key: PathBuf,
        /// Check admission tokens against this key ring too.
        #[arg(long)]
        token_keys: Option<PathBuf>,
        /// Files of frames.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print one JSON object per frame.
        #[arg(long)]
        json: bool,
    },
}
