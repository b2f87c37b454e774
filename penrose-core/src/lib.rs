//! Penrose core: the logic every tier shares, with no I/O and no async, so that the agent, the
//! aggregation server and the design server agree byte for byte and can be tested in isolation.
//!
//! Data flows one way through these modules:
//!
//! - [`fingerprint`]: kernel-name sequences (or launch shapes) -> n-gram shingles ->
//!   MinHash -> snippet hashes, similarity estimates and LSH bands (how the aggregator groups
//!   snippets into applications).
//! - [`schedule`]: when capture windows open (the overhead-budget scheduler and the probe cost
//!   it consumes), shared by the agent and the design server's fleet simulator.
//! - [`calendar`]: days as dates and as command-line arguments (`today+N`).
//! - [`gpu`]: the GPU architecture a report's counters were read on.
//! - [`sampling`]: which launches are sampled (1 in S, offset re-drawn every O seconds).
//! - [`counters`]: the versioned counter catalogue and the mapping of a value to one of 128 bins.
//! - [`histogram`]: 128-bin histograms of sampled counter values (and the age they seal at).
//! - [`paillier`]: packed Paillier encryption of histograms, homomorphic sums, decryption.
//! - [`wire`]: the versioned, length-delimited report and ack messages.
//! - [`datagrams`]: QUIC datagrams framed on a byte stream (the Tor path).
//! - [`release`]: what must hold before a sum reaches the key holder (epochs, contributor
//!   bound, floors on k, T and key size, the day tolerance).
//! - `bundle` (feature `bundle`): the signed export bundle of encrypted sums that the
//!   aggregation server writes and the design server imports.
//! - `audit` (feature `bundle`): how the design server asks the release auditor, the second
//!   key holder, for its partial decryptions of a bundle's released sums.
//! - `evidence` (features `tokens` and `bundle`): contributor evidence, the second token per
//!   report that only the release auditor verifies, and how it counts a released sum's
//!   contributors from it, so that the aggregation server cannot make them up.
//! - `evidence_file` (feature `bundle`): the file a bundle's evidence travels in, framed so
//!   that the design server forwards it page by page without the token code.
//! - `key_list` (feature `key-list`): the design server's signed list of which Paillier key
//!   encrypts which day's reports, so that keys roll over without stopping the fleet.
//! - `tokens` (feature `tokens`): anonymous admission tokens (RFC 9497 VOPRF, Privacy Pass
//!   style) that the issuer issues, the agent spends on its reports and the aggregation server
//!   verifies, so that only enrolled agents report and no token links to its agent.

#[cfg(feature = "bundle")]
pub mod audit;
#[cfg(feature = "bundle")]
pub mod bundle;
pub mod calendar;
pub mod counters;
pub mod datagrams;
#[cfg(all(feature = "tokens", feature = "bundle"))]
pub mod evidence;
#[cfg(feature = "bundle")]
pub mod evidence_file;
pub mod fingerprint;
pub mod gpu;
pub mod hex;
pub mod histogram;
#[cfg(feature = "key-list")]
pub mod key_list;
pub mod paillier;
pub mod release;
pub mod sampling;
pub mod schedule;
#[cfg(feature = "tokens")]
pub mod tokens;
pub mod wire;
