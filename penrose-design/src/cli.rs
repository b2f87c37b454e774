//! The `penrose-design` command line: its clap definition, here in the library so that the
//! binary parses it and `cargo xtask dist` renders man pages and shell completions from it.

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};
use penrose_core::calendar::DaySpec;
use penrose_core::release::{ReportsPerContributor, Threshold};

use crate::labels::Label;

/// The clap command `penrose-design` parses (man pages and completions are made from it).
pub fn command() -> clap::Command {
    Cli::command()
}

/// The Penrose design server: holds the private key, and decrypts only released sums that
/// enough contributors are behind.
///
/// The flow: `keygen` once; give public.key to the aggregation server and the agents; `import`
/// each bundle the aggregation server exports (`penrose-aggregator export`), in order; `report`.
/// To roll keys over: `key-list-signer` once (pin its .pub on the aggregation server and the
/// agents), `keygen` a new key, `key-list` with the old and the new key, signed; load it on
/// the aggregation server (`reload-keys`), which hands it to the agents.
///
/// Exit codes: 0 success, 1 error, 2 usage, 3 a bundle was refused (bad signature, another
/// server, malformed, a fork, a gap, an unannounced new chain).
#[derive(Parser)]
#[command(version, about, long_about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands (each variant's doc comment is its help text; the type's own doc comment
/// is overridden by [`Cli`]'s).
#[derive(Subcommand)]
pub enum Command {
    /// Generate a 2048-bit Paillier key pair, whole or split with a release auditor.
    ///
    /// Writes DIR/private.key (mode 0600; keep it on this server only) and DIR/public.key (give
    /// it to the aggregation server and ship it with the agents). Existing keys are never
    /// overwritten. Prints the key id that every report will carry.
    ///
    /// With --split the private key is never written: it is dealt into DIR/design.share (mode
    /// 0600, stays here) and DIR/auditor.share (mode 0600: hand it to the release auditor's
    /// operator, `penrose-auditor init --share`, and delete it here), with DIR/verification.key
    /// (public, for both). Every sum then needs the auditor's partial decryption
    /// (`penrose-design audit`), which it gives once per sum of the chain it follows.
    /// Examples:
    ///   penrose-design keygen --out /etc/penrose/keys
    ///   penrose-design keygen --split --out /etc/penrose/keys
    Keygen {
        /// Directory to write the key files into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Split the key with a release auditor (2-of-2 threshold): no private.key is written.
        #[arg(long)]
        split: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import export bundles from the aggregation server into the archive, in chain order.
    ///
    /// Each bundle's ed25519 signature is checked against the aggregation server's key: pass
    /// its `.pub` file (printed by `penrose-aggregator serve`, next to its signing key) with
    /// --signer at the first import, which pins it; later imports are checked against the
    /// pinned key. Bundles form a chain per aggregator store: bundle n+1 is accepted only
    /// after bundle n, and must name its hash. A fork (same number, other bytes), a gap, or a
    /// bundle of another chain is refused and changes nothing; importing the same bundle again
    /// is harmless. An aggregation server restored from a backup starts a new chain: import its
    /// first bundle with --new-chain (epochs the old chain released are then skipped, never
    /// merged twice). Example:
    ///   penrose-design import --archive /var/lib/penrose-design --signer agg.pub 1.bundle 2.bundle
    Import {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The aggregation server's public signing key (64 hex digits).
        #[arg(long)]
        signer: Option<PathBuf>,
        /// Accept the first bundle of a new chain descending from the one followed (a restore).
        #[arg(long)]
        new_chain: bool,
        /// Bundle files.
        #[arg(required = true)]
        bundles: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Keep contributor evidence beside the bundles it is of, for the release auditor.
    ///
    /// Each file is what `penrose-aggregator export-evidence` wrote for one bundle: per
    /// released sum, the reports it adds up and the evidence tokens they carried, which only
    /// the auditor can verify. Its header names the bundle by hash; the bundle must be imported
    /// first, and the file must hold one entry per released sum. `audit` then forwards each
    /// page's evidence with the page. The design server checks only the framing; an auditor
    /// that counts contributors itself refuses pages without evidence. Exit code 3, nothing
    /// changed, when a file is refused. Example:
    ///   penrose-design import-evidence --archive /var/lib/penrose-design 0007.evidence
    ImportEvidence {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// Evidence files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask the release auditor for its partial decryptions of every archived bundle.
    ///
    /// Needed when the key was generated with `keygen --split`. Bundles go to the auditor in
    /// chain order, exactly as imported, a page of entries at a time; each answer is kept in
    /// the archive (ARCHIVE/audit/) before the next is asked, and pages already answered are
    /// not asked again. The auditor checks each bundle (the aggregation server's signature,
    /// the chain it follows, that no epoch was answered before under any chain, its own
    /// threshold) and refuses with a reason; a refusal changes nothing on either side and
    /// exits with 3. Example:
    ///   penrose-design audit --archive /var/lib/penrose-design --auditor 10.0.0.7:4435 \
    ///     --auditor-cert auditor.pem
    Audit {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The auditor's address (UDP).
        #[arg(long)]
        auditor: std::net::SocketAddr,
        /// The auditor's certificate (PEM or DER), pinned: nothing else is accepted.
        #[arg(long)]
        auditor_cert: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decrypt the released sums above the contributor threshold and print them.
    ///
    /// Per class and counter: reports, samples, the contributor bound, mean and percentiles
    /// at bin resolution, and (with --json or --csv-bins) the 128 bin sums; classes with their
    /// labels (`penrose-design label`). Per joint view (two counters read on the same launch,
    /// binned into a 16 x 8 grid: tensor_x_dram, duration_x_occupancy, registers_x_occupancy)
    /// the share of samples in each quadrant around a split (--split), and of kernel time
    /// where an axis is a duration. --html DIR also writes DIR/index.html, one page with
    /// the plots (histograms, heat maps) and tables that opens in a browser from the file;
    /// --svg DIR the plots as .svg files. A released sum is
    /// decrypted only when at least --threshold contributors are behind it, counted as
    /// reports / (T x days of its epoch) rounded up, T = --reports-per-contributor; others are
    /// listed as held back. A sum whose bins do not add up to the samples its reports declared
    /// is quarantined (listed, not added); the rest still decrypt. The contributor count of an
    /// aggregate is the largest bound among the sums it adds (bounds of different epochs do
    /// not add: the same owners may be behind each). --from/--until report a period. Example:
    ///   penrose-design report --archive /var/lib/penrose-design --key keys/private.key
    ///   penrose-design report --archive /var/lib/penrose-design --key keys/private.key --html out
    ///   penrose-design report --archive A --key K --split tensor_x_dram:50,30 --csv-quadrants
    ///   penrose-design report --archive A --key K --from today-7 --until today-1
    Report {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The private key (mode 0600); once per key when sums are under several (after a key
        /// rollover).
        #[arg(long, required_unless_present = "split_key")]
        key: Vec<PathBuf>,
        /// A split key's directory (`keygen --split`: public.key, verification.key,
        /// design.share); sums under it are decrypted with the auditor's partials
        /// (`penrose-design audit`), and listed as awaiting the auditor where there are none.
        #[arg(long, value_name = "DIR")]
        split_key: Vec<PathBuf>,
        /// k: the fewest contributors a sum must have to be decrypted (at least 10).
        #[arg(long, default_value_t = Threshold::DEFAULT.get())]
        threshold: u64,
        /// T: the most reports one agent sends per counter and day (at least 24).
        #[arg(long, default_value_t = ReportsPerContributor::DEFAULT.get())]
        reports_per_contributor: u32,
        /// Only epochs whose report days all lie on or after DAY (today, today-N, YYYY-MM-DD
        /// or a day number): with --until, a day's or a week's view, made by adding the
        /// released sums of the epochs within, never by differencing two releases.
        #[arg(long, value_name = "DAY")]
        from: Option<DaySpec>,
        /// Only epochs whose report days all lie on or before DAY (default with --from: today).
        #[arg(long, value_name = "DAY")]
        until: Option<DaySpec>,
        /// Print JSON (every bin, and every joint view's quadrants).
        #[arg(long, conflicts_with_all = ["csv", "csv_bins", "csv_quadrants"])]
        json: bool,
        /// Print CSV: one row per decrypted (class, counter) with its statistics.
        #[arg(long, conflicts_with_all = ["csv_bins", "csv_quadrants"])]
        csv: bool,
        /// Print CSV: one row per non-empty bin, with its edges (a joint view's cell: the
        /// edges of both counters).
        #[arg(long, conflicts_with = "csv_quadrants")]
        csv_bins: bool,
        /// Print CSV: one row per quadrant of each decrypted joint view, with its share of
        /// samples and, where an axis is a duration, of kernel time.
        #[arg(long)]
        csv_quadrants: bool,
        /// Where to split a joint view into quadrants: VIEW:X,Y in the counters' units
        /// (percent, nanoseconds, registers), moved to the nearest cell edge; once per view.
        /// Defaults: 50 for percentages, 10000 ns for durations, 128 registers. Example:
        /// --split tensor_x_dram:50,30 --split duration_x_occupancy:100000,25
        #[arg(long = "split", value_name = "VIEW:X,Y", value_parser = crate::joint::parse_split)]
        splits: Vec<(&'static str, crate::joint::Split)>,
        /// Also write DIR/index.html: the report as one self-contained page (created if
        /// missing; an existing index.html is replaced).
        #[arg(long, value_name = "DIR")]
        html: Option<PathBuf>,
        /// Also write the plots as SVG files into DIR: overview.svg and
        /// class-C-ARCH-counter-N.svg.
        #[arg(long, value_name = "DIR")]
        svg: Option<PathBuf>,
        /// Also write the plots as PNG files into DIR, named as with --svg (.png), at twice
        /// the SVG's size. Text needs a font under /usr/share/fonts (fonts-dejavu-core);
        /// without one the plots are written without text, with a warning.
        #[arg(long, value_name = "DIR")]
        png: Option<PathBuf>,
    },
    /// Label a class (or with --remove, remove its label); reports show the label.
    ///
    /// Classes are named by their id (stable along the archive's chains). A label is 1 to 64
    /// printable characters, kept in the archive directory's `labels` file (mode 0600), never
    /// sent anywhere. Only classes of imported bundles can be labelled. Example:
    ///   penrose-design label --archive /var/lib/penrose-design 7 "bert-train"
    Label {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// Remove the class's label.
        #[arg(long)]
        remove: bool,
        /// The class id.
        class: u32,
        /// The label.
        #[arg(required_unless_present = "remove", conflicts_with = "remove")]
        label: Option<Label>,
    },
    /// List the classes' labels.
    Labels {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    // Its help is `SimulateArgs`'s documentation (a doc comment here would replace it);
    // boxed, it keeps `Command` small.
    #[allow(missing_docs)]
    Simulate(Box<crate::simulate::cli::SimulateArgs>),
    /// Create the key that signs key lists: DIR/list-signing.key (mode 0600; keep it on this
    /// server) and DIR/list-signing.pub (64 hex digits).
    ///
    /// The aggregation server (`key_list_signer`) and every agent (`design.key_list_signer`)
    /// pin the .pub file: a key list that does not verify under it is refused, so the
    /// aggregation server cannot slip in a key of its own. Existing files are never
    /// overwritten. Example:
    ///   penrose-design key-list-signer --out /etc/penrose/keys
    KeyListSigner {
        /// Directory to write the two files into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sign a key list: which public key encrypts the reports of which day.
    ///
    /// Each --key is PUBLIC_KEY_FILE@DAY (DAY: today, today+N, YYYY-MM-DD or a day number):
    /// the key encrypts reports from that day until the next key's day. Give the current key
    /// and the next one from a day far enough ahead that agents learn it first (they fetch the
    /// list from the aggregation server at least daily): a week is safe. Reports still under
    /// the previous key are accepted for --grace-days after the switch. --sequence must grow
    /// with every list: holders refuse an older one. Example:
    ///   penrose-design key-list --signing-key keys/list-signing.key \
    ///     --key old/public.key@2026-01-01 --key new/public.key@today+7 --sequence 2 \
    ///     --out keys.list
    KeyList {
        /// The list-signing key (`key-list-signer` wrote it; mode 0600).
        #[arg(long)]
        signing_key: PathBuf,
        /// PUBLIC_KEY_FILE@DAY, once per key, by increasing day (1 to 4 keys).
        #[arg(long = "key", required = true, value_name = "FILE@DAY")]
        keys: Vec<String>,
        /// The list's number: larger than every list signed before.
        #[arg(long)]
        sequence: u64,
        /// Days after a switch during which reports under the previous key are still accepted.
        #[arg(long, default_value_t = penrose_core::key_list::DEFAULT_GRACE_DAYS)]
        grace_days: u8,
        /// The list file to write (replaced atomically).
        #[arg(long)]
        out: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a key file's id and size; a private key file is also checked for its permissions.
    KeyInfo {
        /// A private.key or public.key file.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}
