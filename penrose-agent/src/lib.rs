//! The Penrose agent as a library: what the `penrose-agent` binary runs, and what its tests
//! and the demo drive directly.
//!
//! - [`cli`]: the command line's clap definition (the binary's, and the man pages').
//! - [`config`]: the TOML configuration file, its defaults and its errors.
//! - [`capture`]: eBPF probes on libcuda, capture windows, snippets and sampled launches.
//! - [`counters`]: where a sampled launch's counter values come from (NVML, the stand-in).
//! - [`source`]: snippet sources: the live capture, or traces replayed as if captured.
//! - [`design_keys`]: which design server key encrypts which day's reports: the configured
//!   key, then the design server's signed key list fetched from the aggregation server.
//! - [`pipeline`]: snippets -> local applications -> histograms -> sealed, encrypted reports.
//! - [`record`]: the agent's own plaintext record of what it sealed (for `inspect`).
//! - [`spool`]: the durable, bounded directory of reports waiting to be sent.
//! - [`tokens`]: the store of anonymous admission tokens and the issuer's key set as seen.
//! - [`admission`]: this host's enrolment credential and the fetcher that gets tokens.
//! - [`upload`]: spooled reports to the aggregator, with delays, retries, throttling and a
//!   token on each report.
//! - [`status`]: the status file `penrose-agent status` reads.
//! - [`daemon`]: `penrose-agent run`, which ties them together.
//! - [`signal`]: SIGINT/SIGTERM end long work cleanly.

pub mod admission;
pub mod capture;
pub mod cli;
pub mod config;
pub mod counters;
pub mod daemon;
pub mod design_keys;
pub mod pipeline;
pub mod privilege;
pub mod record;
pub mod signal;
pub mod source;
pub mod spool;
pub mod status;
pub mod tokens;
pub mod upload;
