//! The Penrose token issuer: it enrols hosts and issues each enrolled host at most T blinded
//! admission tokens per (day, counter), so that only enrolled agents may report, at a bounded
//! rate, and nobody can link a token to the host it was issued to (issue 11;
//! `penrose_core::tokens` holds the cryptography, docs/threat-model.md says what the issuer
//! learns).
//!
//! A request's way through the issuer, module by module:
//!
//! - [`service`]: the QUIC request/answer endpoint (`penrose_transport::exchange`, ALPN
//!   `penrose-issuer/1`); each request is answered off the async threads.
//! - [`issuer`]: the answer: the published key set, or per batch of blinded elements the
//!   credential check, the rate limit, the quota of its (epoch, scope), the evaluation and the
//!   synced write of the new count before the answer leaves.
//! - [`keys`]: every issuer key derived from one master seed per (day, counter); the key set
//!   published around today and the key rings exported to the aggregation server.
//! - [`store`]: RocksDB: enrolled credentials (by hash), issued counts per (epoch, scope,
//!   credential), request-rate records, meta.
//!
//! And around it:
//!
//! - [`seed`]: the master seed file (32 bytes, 0600, refused when others may read it).
//! - [`credential`]: enrolment credentials, their ids and files.
//! - [`state`]: the state directory's layout.
//! - [`admin`]: enrol, revoke and status, against a running issuer (its control socket) or the
//!   store opened directly.
//! - [`cli`]: the command line's clap definition (the binary's, and the man pages').
//! - [`error`]: what can go wrong, typed.

#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod credential;
pub mod error;
pub mod issuer;
pub mod keys;
pub mod seed;
pub mod service;
pub mod state;
pub mod store;

pub use credential::CredentialId;
pub use error::IssuerError;
pub use issuer::{Issuer, IssuerConfig};
pub use seed::MasterSeed;
pub use state::StateDir;
