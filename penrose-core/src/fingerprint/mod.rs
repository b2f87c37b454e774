//! Snippet fingerprints: how the fleet learns that two windows of kernel launches come from the
//! same application without learning the kernels' names.
//!
//! A snippet (the kernel names one process launched in a capture window) goes through:
//!
//! - [`shapes`]: what stands for a launch when the agent has no name for it: its launch
//!   configuration and the distance back to the previous launch of the same handle (launch
//!   shapes, unchanged by any consistent renaming of handles), digested like names.
//! - [`shingle`]: n-grams of names, each digested with SHA-256, so that reversing a shingle means
//!   enumerating n-tuples of kernel names; a launch without a name enters as its shape's
//!   digest ([`Element`]).
//! - [`minhash`]: k MinHash values over the digests, either over the *set* of shingles or over
//!   their *counts* (weighted MinHash), which tolerates perturbed launches better.
//! - [`snippet`]: the compact 256-bit [`SnippetHash`] (b-bit MinHash) that reports carry, and the
//!   Jaccard estimator that corrects for accidental b-bit collisions.
//! - [`locator`]: band keys over the full MinHash values, which reports carry beside the hash
//!   so that the aggregator finds a snippet's class by a fixed number of look-ups however many
//!   classes it holds.
//! - [`lsh`]: banding of the snippet hash's 2-bit values: too unselective to place reports
//!   (an unrelated class is a candidate 4 times in 10), kept for the measurement that shows it.
//! - [`params`]: the tunable parameters and their defaults, chosen by `cargo xtask
//!   eval-fingerprints` (see `docs/evaluation.md`).

pub mod locator;
pub mod lsh;
pub mod minhash;
pub mod params;
pub mod shapes;
pub mod shingle;
pub mod snippet;

#[cfg(test)]
mod proptests;

pub use locator::{Fingerprint, LOCATOR_BANDS, LOCATOR_BYTES, Locator, LocatorKey};
pub use lsh::{BandKey, LshBands};
pub use minhash::{MinHashSignature, MinHasher};
pub use params::{
    DEFAULT_NGRAM_LEN, DEFAULT_NUM_HASHES, DEFAULT_TAU, DEFAULT_WEIGHTING, FingerprintParams,
    ParamsError, SNIPPET_HASH_BITS, Weighting,
};
pub use shapes::{
    LaunchConfig, LaunchShape, MAX_GAP_BUCKET, RepetitionTracker, combined_digest, gap_bucket,
    launch_shapes, name_free_digests, repetition_distances,
};
pub use shingle::{
    Element, NameDigest, ShingleKey, shingle_keys, shingle_keys_of_digests,
    shingle_keys_of_elements,
};
pub use snippet::{Fingerprinter, MalformedSnippet, SnippetHash};
