//! The Penrose agent as a library: what the `penrose-agent` binary runs, and what its tests
//! drive directly.
//!
//! - [`capture`]: eBPF probes on libcuda, capture windows and snippets.

pub mod capture;
