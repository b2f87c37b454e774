//! Interoperability with python-paillier (`phe`), an independent implementation of Paillier
//! with g = n + 1: phe decrypts our packed ciphertexts (DJN and plain) given p and q, and we
//! decrypt phe's. Fails when `python3` or `phe` is missing, unless PENROSE_SKIP_PHE=1
//! (developers only; CI installs phe).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use penrose_core::paillier::{
    Accumulator, BIN_COUNT, KeySize, Keypair, MAX_BIN_VALUE, PackedCiphertexts, SLOT_BITS,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{Value, json};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn run_phe(request: &Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/phe_interop.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run python3 (needed with python-paillier for this test)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "phe peer failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn random_bins(rng: &mut ChaCha20Rng) -> Vec<u64> {
    (0..BIN_COUNT)
        .map(|_| rng.random_range(0..=MAX_BIN_VALUE))
        .collect()
}

fn exchange(size: KeySize, seed: u64, plain: bool) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let pair = Keypair::generate_with_size(size, &mut rng);
    let public = pair.public_key();
    let ours = random_bins(&mut rng);
    let theirs = random_bins(&mut rng);
    let packed = if plain {
        public.encrypt_packed_plain(&ours, &mut rng).unwrap()
    } else {
        public.encrypt_packed(&ours, &mut rng).unwrap()
    };
    let wire = packed.to_bytes();
    let request = json!({
        "private_key": hex(&pair.private_key().to_bytes()),
        "slot_bits": SLOT_BITS,
        "slots_per_ciphertext": size.slots_per_ciphertext(),
        "ciphertexts": wire.chunks(size.ciphertext_bytes()).map(hex).collect::<Vec<_>>(),
        "bins": theirs,
    });
    let response = run_phe(&request);

    let decrypted_by_phe: Vec<u64> =
        serde_json::from_value(response["decrypted_bins"].clone()).unwrap();
    assert_eq!(decrypted_by_phe, ours, "phe decrypts our ciphertexts");
    assert_eq!(
        response["h_s_plaintext"], "0",
        "h_s is an encryption of zero"
    );

    let phe_wire: Vec<u8> = response["ciphertexts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|text| unhex(text.as_str().unwrap()))
        .collect();
    let from_phe: PackedCiphertexts = public.validate_packed(&phe_wire).unwrap();
    let decrypted = pair.private_key().decrypt_packed(&from_phe).unwrap();
    assert_eq!(decrypted.to_vec(), theirs, "we decrypt phe's ciphertexts");

    // Ciphertexts from both implementations add up homomorphically.
    let mut accumulator = Accumulator::new(public);
    accumulator.absorb(&packed, MAX_BIN_VALUE).unwrap();
    accumulator.absorb(&from_phe, MAX_BIN_VALUE).unwrap();
    let sum = pair
        .private_key()
        .decrypt_packed(&accumulator.sum().unwrap())
        .unwrap();
    let expected: Vec<u64> = ours.iter().zip(&theirs).map(|(a, b)| a + b).collect();
    assert_eq!(sum.to_vec(), expected);
}

#[test]
fn python_paillier_interoperates() {
    if std::env::var_os("PENROSE_SKIP_PHE").is_some_and(|v| v == "1") {
        eprintln!("PENROSE_SKIP_PHE=1: skipping the python-paillier interoperability test");
        return;
    }
    exchange(KeySize::Bits2048, 11, false);
    exchange(KeySize::Bits2048, 12, true);
    exchange(KeySize::Bits1024, 13, false);
}
