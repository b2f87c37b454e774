//! The Penrose agent as a library: what the `penrose-agent` binary runs, and what its tests
//! and the demo drive directly. The binary only parses the command line, calls one function
//! below per subcommand, and prints its typed result as text or JSON.
//!
//! The daemon (`penrose-agent run`):
//! - [`service`]: the process around the daemon: opt-out, capabilities, signals, runtime.
//! - [`daemon`]: the daemon itself, which ties the parts below together.
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
//! - [`privilege`]: dropping the capabilities capture does not need.
//! - [`test_equipment`]: whether this build has the trace replay and the stand-in ring, and
//!   what a setting naming them says.
//!
//! What the other subcommands show:
//! - [`cli`]: the command line's clap definition (the binary's, and the man pages').
//! - [`status`]: the status file the daemon writes and `status` reads and prints.
//! - [`inspect`]: exactly what will leave the machine: the spooled reports' plaintext.
//! - [`config_check`]: what `config --check` says about a valid file.
//! - [`capture_summary`]: a capture run on the operator's machine and what it saw.
//! - [`trace_fingerprint`]: a profiler trace's fingerprints, computed offline.
//! - [`catalogue`]: the counters the agent samples, their units and binning.

pub mod admission;
pub mod capture;
pub mod capture_summary;
pub mod catalogue;
pub mod cli;
pub mod config;
pub mod config_check;
pub mod counters;
pub mod daemon;
pub mod design_keys;
pub mod inspect;
pub mod pipeline;
pub mod privilege;
pub mod record;
pub mod service;
pub mod source;
pub mod spool;
pub mod status;
pub mod test_equipment;
pub mod tokens;
pub mod trace_fingerprint;
pub mod upload;
