//! The Penrose design server: the one place that holds the private key. It decrypts aggregates
//! only above a contributor threshold and turns them into reports for architects.
//!
//! - [`keyfile`]: key files on disk, with the private key readable by its owner alone.
//! - [`archive`]: imported export bundles, verified against the pinned aggregation server's
//!   key and merged into every accumulator's current value.
//! - [`report`]: decryption above the contributor threshold; histograms, means and
//!   percentiles per (class, counter) as text, JSON or CSV.
//!
//! The fleet simulator arrives with its issue.

pub mod archive;
pub mod keyfile;
pub mod report;
