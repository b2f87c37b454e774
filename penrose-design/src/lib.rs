//! The Penrose design server: the one place that holds the private key. It decrypts aggregates
//! only above a contributor threshold and turns them into reports for architects.
//!
//! - [`keyfile`]: key files on disk, with the private key readable by its owner alone.
//!
//! Bundle import, decryption with the threshold, reports and the fleet simulator arrive with
//! their issues.

pub mod keyfile;
