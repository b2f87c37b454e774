//! The Penrose aggregation server: it receives encrypted reports, groups similar snippets into
//! application classes and adds ciphertexts, without ever holding a private key.
//!
//! A report's way through the server, module by module:
//!
//! - [`validate`]: the checks every report passes before it may touch a sum.
//! - [`design_keys`]: which of the design server's keys a report of a given day may be under
//!   (its signed key list), and each key's slot in the store.
//! - [`admission`]: which reports may reach the tables at all: admission tokens, verified
//!   before anything is stored and spent once.
//! - [`ingest`]: the pipeline a transport calls: validate, queue, batch, durable write, ack.
//! - [`state`]: applying a batch: spent tokens, deduplication, classes, sums, all in one synced
//!   write.
//! - [`epochs`]: which released sum each report joins, and when a sum is final.
//! - [`tables`]: the SST and EST, snippet hash -> application class, found through the
//!   reports' locators.
//! - [`aggregate`]: per (class, counter, epoch) the homomorphic sums, in generations that
//!   never overflow a slot.
//! - [`store`]: durable storage behind a trait; RocksDB.
//!
//! And around it:
//!
//! - [`copies`]: backups and copied directories as new instances that never release their
//!   parent's epochs.
//! - [`export`]: the chain of signed bundles of released sums (closed epochs, at or above the
//!   contributor threshold) for the design server, taken while serving.
//! - [`evidence`]: each report of a sum kept for the release auditor, which counts
//!   contributors itself (`penrose_core::evidence`); off unless asked for.
//! - [`metrics`]: Prometheus counters and the HTTP responder that serves them.
//! - [`control`]: the admin channel (a Unix socket in the data directory) the CLI talks to,
//!   and ([`control::reply`]) the replies both ends share.
//! - [`output`]: what the offline commands (`verify`, `check-report`) print, as types.
//! - [`cli`]: the command line's clap definition (the binary's, and the man pages').
//! - [`config`]: the data directory and the server's configuration file.
//! - [`settings`]: `serve`'s flags and file, checked once into the options it runs with.
//! - [`serve`]: the server process: transport, writer, control channel, metrics.
//! - `loadgen`: the load generator, and `fleet`, the synthetic fleet it and the fleet
//!   benchmark draw reports from: test equipment, compiled in only with the `test-util`
//!   feature (tests, benchmarks, the demo), never in a packaged server.

pub mod admission;
pub mod aggregate;
pub mod cli;
pub mod config;
pub mod control;
pub mod copies;
pub mod design_keys;
pub mod epochs;
pub mod evidence;
pub mod export;
#[cfg(feature = "test-util")]
pub mod fleet;
pub mod ingest;
#[cfg(feature = "test-util")]
pub mod loadgen;
pub mod metrics;
pub mod output;
pub mod serve;
pub mod settings;
pub mod state;
pub mod store;
pub mod tables;
pub mod validate;
