//! The Penrose design server: the one place that holds the private key. It decrypts released
//! sums only above a contributor threshold and turns them into reports for architects.
//!
//! - [`cli`]: the command line's clap definition (the binary's, and the man pages').
//! - [`keyfile`]: key files on disk, with the private key readable by its owner alone, and
//!   keys under 2048 bits refused.
//! - [`key_list`]: key rollover: the list-signing key, and the signed list of which key
//!   encrypts which day's reports.
//! - [`archive`]: imported export bundles, verified against the pinned aggregation server's
//!   key and accepted only in chain order (forks, gaps, replays and unannounced new chains
//!   refused); each released epoch merged once.
//! - [`audit`]: the release auditor's partial decryptions under a split key, asked for
//!   bundle by bundle in chain order and kept in the archive.
//! - [`evidence`]: each bundle's contributor evidence, kept beside it and forwarded to the
//!   auditor page by page, its framing checked, its contents never read.
//! - [`labels`]: architects' names for classes, kept in the archive directory.
//! - [`report`]: decryption above the contributor bound, quarantine of sums that do not
//!   decrypt to their declared samples; histograms, means and percentiles per (class,
//!   counter) as text, JSON or CSV.
//! - [`joint`]: joint counter views (two counters binned into one grid) split into
//!   quadrants at thresholds an architect picks, with each quadrant's share of samples and,
//!   where an axis is a duration, of kernel time.
//! - [`scale`]: how a decrypted counter's values read (its catalogue binning, values with
//!   their unit), shared by the report and the plots.
//! - [`output`]: what the other commands print (`keygen`, `key-info`, `labels`, `import`),
//!   as types the JSON and the text are printed from.
//! - [`plot`] and [`html`]: the report's plots as SVG (histograms, heat maps of joint views,
//!   the fleet overview) and
//!   one self-contained HTML page with them and the tables.
//! - [`png`]: the same plots as PNG files, rasterised from their SVG.
//! - [`simulate`]: the fleet simulator: hours until a fleet's applications are covered, under
//!   the agent's sampler, window scheduler and sealing and the servers' release rule.

pub mod archive;
pub mod audit;
pub mod cli;
pub mod evidence;
pub mod html;
pub mod joint;
pub mod key_list;
pub mod keyfile;
pub mod labels;
pub mod output;
pub mod plot;
pub mod png;
pub mod report;
pub mod scale;
pub mod simulate;
