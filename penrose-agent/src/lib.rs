//! The Penrose agent as a library: what the `penrose-agent` binary runs, and what its tests
//! drive directly.
//!
//! - [`capture`]: eBPF probes on libcuda, capture windows, snippets and sampled launches.
//! - [`counters`]: where a sampled launch's counter values come from (NVML, the stand-in).
//! - [`signal`]: SIGINT/SIGTERM end long work cleanly.

pub mod capture;
pub mod counters;
pub mod signal;
