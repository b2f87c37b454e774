//! The Penrose release auditor: the second holder of the design server's split Paillier key
//! (`penrose_core::paillier::threshold`, `docs/crypto.md` "Threshold decryption (2-of-2)").
//! A released sum decrypts only with a partial decryption from each holder, so the auditor's
//! partial is its consent to a release. It gives it only after checks of its own, so that the
//! vendor, who runs the aggregation and design servers, cannot decrypt a sum the release rule
//! would not release, or release an epoch twice, without the auditor's operator (ideally
//! another party) seeing it refused.
//!
//! A request's way through the auditor, module by module:
//!
//! - [`service`]: the QUIC request/answer endpoint (`penrose_transport::exchange`, ALPN
//!   `penrose-auditor/1`); each answer is computed off the async threads, a few at a time.
//! - [`auditor`]: the policy: decode the request, verify the bundle against the pinned
//!   aggregation server's key, admit it to the followed chain, check the page and its keys,
//!   and record the bundle durably before any partial leaves.
//! - [`record`]: the chain followed, its last bundle and every epoch ever answered (the one
//!   piece of state that changes), and the pure rule that admits a bundle to it.
//! - [`page`]: one page of a bundle: its bounds, its keys, its ciphertexts validated, the
//!   auditor's own threshold per entry, and the partial decryptions, spread over threads.
//! - [`evidence`]: with its party's token key ring, the contributors of each sum counted from
//!   the page's evidence, and every token counted once, ever.
//! - [`policy`]: the auditor's own contributor threshold k and cap T.
//! - [`keys`]: the key shares held, the files they come from, and the pinned aggregation
//!   server key.
//!
//! And around it:
//!
//! - [`data_dir`]: the data directory's layout and its lock.
//! - [`admin`]: init, add-share and follow, which change the data directory, and status.
//! - [`cli`]: the command line's clap definition.
//! - [`error`]: what can go wrong, typed.

#![forbid(unsafe_code)]

pub mod admin;
pub mod auditor;
pub mod cli;
pub mod data_dir;
pub mod error;
pub mod evidence;
pub mod keys;
pub mod page;
pub mod policy;
pub mod record;
pub mod service;

pub use admin::{Added, AuditorStatus, Followed, InitOptions, Initialised};
pub use auditor::Auditor;
pub use data_dir::DataDir;
pub use error::AuditorError;
pub use keys::Shares;
pub use policy::Policy;
pub use record::{Answered, Chain, Link, Record, Take};
