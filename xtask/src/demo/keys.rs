//! The design server's keys: a key pair split with the release auditor, a list-signing key
//! and the signed key list naming the key.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use penrose_core::paillier::PublicKey;

use super::Options;
use super::process::{Bins, Stages, output};

/// The design server's keys of a run.
pub(super) struct DesignKeys {
    /// The key folder: the design server's share, the auditor's (until the auditor holds
    /// it), the verification key, the list-signing key.
    pub dir: PathBuf,
    /// The public key's file.
    pub public_key: PathBuf,
    /// The public key.
    pub public: PublicKey,
    /// The list-signing key's public half, which agents pin.
    pub list_signer: PathBuf,
    /// The signed key list (one key, for every day).
    pub key_list: PathBuf,
}

/// `penrose-design keygen --split` (no private key is ever written), `key-list-signer` and
/// `key-list`, in `dir/keys`. The aggregation server applies the list and hands it to the
/// agents, which verify it under the list-signing key they pin.
pub(super) fn make_design_keys(
    (options, bins, dir): (&Options, &Bins, &Path),
    stages: &mut Stages,
) -> Result<DesignKeys> {
    let t = Instant::now();
    let keys = dir.join("keys");
    output(
        // Split with the release auditor: no private key is ever written.
        bins.command("penrose-design")
            .arg("keygen")
            .arg("--split")
            .arg("--out")
            .arg(&keys),
        "penrose-design keygen --split",
    )?;
    let public_key = keys.join("public.key");
    let public = PublicKey::from_bytes(&std::fs::read(&public_key)?)?;
    stages.record("design server: keygen", t);
    options.say(&format!("design server: key {}", public.key_id()));
    output(
        bins.command("penrose-design")
            .arg("key-list-signer")
            .arg("--out")
            .arg(&keys),
        "penrose-design key-list-signer",
    )?;
    let key_list = keys.join("keys.list");
    output(
        bins.command("penrose-design")
            .arg("key-list")
            .arg("--signing-key")
            .arg(keys.join("list-signing.key"))
            .arg("--key")
            .arg(format!("{}@1970-01-01", public_key.display()))
            .args(["--sequence", "1", "--out"])
            .arg(&key_list),
        "penrose-design key-list",
    )?;
    Ok(DesignKeys {
        list_signer: keys.join("list-signing.pub"),
        dir: keys,
        public_key,
        public,
        key_list,
    })
}
