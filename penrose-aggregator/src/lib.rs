//! The Penrose aggregation server: it receives encrypted reports, groups similar snippets into
//! application classes and adds ciphertexts, without ever holding a private key.
//!
//! - [`validate`]: the checks every report passes before it may touch a sum.
//!
//! Ingest over QUIC, the SST/EST tables, RocksDB storage and export arrive with the
//! aggregation-server issue.

pub mod validate;
