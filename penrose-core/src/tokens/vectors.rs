//! RFC 9497 appendix A.1.2: the test vectors of VOPRF mode, ristretto255-SHA512, run through
//! the same `suite` functions the tokens use. The RFC fixes the blinds and the proof's random
//! scalar; a scripted generator hands them to `voprf` in the form `Scalar::random` reads (64
//! bytes reduced mod the group order: the scalar's 32 little-endian bytes, then zeros).
//!
//! The values are typed in from the RFC's appendix (lines re-joined where the RFC wraps them)
//! and were checked against the final draft's source (draft-irtf-cfrg-voprf, section "Test
//! Vectors", ristretto255-SHA512, VOPRF Mode).

use std::collections::VecDeque;

use rand_core_06::{CryptoRng, RngCore};

use super::suite::{self, Blinded, Client};

const SEED: &str = "a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3a3";
const KEY_INFO: &str = "74657374206b6579";
const SK_SM: &str = "e6f73f344b79b379f1a0dd37e07ff62e38d9f71345ce62ae3a9bc60b04ccd909";
const PK_SM: &str = "c803e2cc6b05fc15064549b5920659ca4a77b2cca6f04f6b357009335476ad4e";

struct Vector {
    inputs: &'static [&'static str],
    blinds: &'static [&'static str],
    blinded_elements: &'static [&'static str],
    evaluation_elements: &'static [&'static str],
    proof: &'static str,
    proof_random_scalar: &'static str,
    outputs: &'static [&'static str],
}

const INPUT_1: &str = "00";
const INPUT_2: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const BLIND_1: &str = "64d37aed22a27f5191de1c1d69fadb899d8862b58eb4220029e036ec4c1f6706";
const BLIND_2: &str = "222a5e897cf59db8145db8d16e597e8facb80ae7d4e26d9881aa6f61d645fc0e";
const OUTPUT_1: &str = concat!(
    "b58cfbe118e0cb94d79b5fd6a6dafb98764dff49c14e1770b566e42402da1a7d",
    "a4d8527693914139caee5bd03903af43a491351d23b430948dd50cde10d32b3c"
);
const OUTPUT_2: &str = concat!(
    "8a9a2f3c7f085b65933594309041fc1898d42d0858e59f90814ae90571a6df60",
    "356f4610bf816f27afdd84f47719e480906d27ecd994985890e5f539e7ea74b6"
);

const VECTORS: [Vector; 3] = [
    // A.1.2.1. Test Vector 1, Batch Size 1
    Vector {
        inputs: &[INPUT_1],
        blinds: &[BLIND_1],
        blinded_elements: &["863f330cc1a1259ed5a5998a23acfd37fb4351a793a5b3c090b642ddc439b945"],
        evaluation_elements: &["aa8fa048764d5623868679402ff6108d2521884fa138cd7f9c7669a9a014267e"],
        proof: concat!(
            "ddef93772692e535d1a53903db24367355cc2cc78de93b3be5a8ffcc6985dd06",
            "6d4346421d17bf5117a2a1ff0fcb2a759f58a539dfbe857a40bce4cf49ec600d"
        ),
        proof_random_scalar: "222a5e897cf59db8145db8d16e597e8facb80ae7d4e26d9881aa6f61d645fc0e",
        outputs: &[OUTPUT_1],
    },
    // A.1.2.2. Test Vector 2, Batch Size 1
    Vector {
        inputs: &[INPUT_2],
        blinds: &[BLIND_1],
        blinded_elements: &["cc0b2a350101881d8a4cba4c80241d74fb7dcbfde4a61fde2f91443c2bf9ef0c"],
        evaluation_elements: &["60a59a57208d48aca71e9e850d22674b611f752bed48b36f7a91b372bd7ad468"],
        proof: concat!(
            "401a0da6264f8cf45bb2f5264bc31e109155600babb3cd4e5af7d181a2c9dc0a",
            "67154fabf031fd936051dec80b0b6ae29c9503493dde7393b722eafdf5a50b02"
        ),
        proof_random_scalar: "222a5e897cf59db8145db8d16e597e8facb80ae7d4e26d9881aa6f61d645fc0e",
        outputs: &[OUTPUT_2],
    },
    // A.1.2.3. Test Vector 3, Batch Size 2
    Vector {
        inputs: &[INPUT_1, INPUT_2],
        blinds: &[BLIND_1, BLIND_2],
        blinded_elements: &[
            "863f330cc1a1259ed5a5998a23acfd37fb4351a793a5b3c090b642ddc439b945",
            "90a0145ea9da29254c3a56be4fe185465ebb3bf2a1801f7124bbbadac751e654",
        ],
        evaluation_elements: &[
            "aa8fa048764d5623868679402ff6108d2521884fa138cd7f9c7669a9a014267e",
            "cc5ac221950a49ceaa73c8db41b82c20372a4c8d63e5dded2db920b7eee36a2a",
        ],
        proof: concat!(
            "cc203910175d786927eeb44ea847328047892ddf8590e723c37205cb74600b0a",
            "5ab5337c8eb4ceae0494c2cf89529dcf94572ed267473d567aeed6ab873dee08"
        ),
        proof_random_scalar: "419c4f4f5052c53c45f3da494d2b67b220d02118e0857cdbcf037f9ea84bbe0c",
        outputs: &[OUTPUT_1, OUTPUT_2],
    },
];

fn hex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2), "odd hex length: {text}");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn hex32(text: &str) -> [u8; 32] {
    hex(text).try_into().unwrap()
}

/// Hands out the RFC's scalars, one per `Scalar::random` call (which reads 64 bytes and
/// reduces them): each scalar's 32 bytes, then 32 zeros. Panics on any other use, so a change
/// in how `voprf` draws randomness fails the test instead of passing silently.
struct Scripted(VecDeque<[u8; 32]>);

impl Scripted {
    fn new(scalars: &[&str]) -> Self {
        Scripted(scalars.iter().map(|s| hex32(s)).collect())
    }
}

impl RngCore for Scripted {
    fn next_u32(&mut self) -> u32 {
        unimplemented!("the vectors script whole scalars only")
    }

    fn next_u64(&mut self) -> u64 {
        unimplemented!("the vectors script whole scalars only")
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        assert_eq!(dest.len(), 64, "voprf draws a scalar from 64 bytes");
        let scalar = self.0.pop_front().expect("a scripted scalar is left");
        dest[..32].copy_from_slice(&scalar);
        dest[32..].fill(0);
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core_06::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl CryptoRng for Scripted {}

#[test]
fn derive_key_pair_gives_the_rfc_keys() {
    let server = suite::derive_key_pair(&hex32(SEED), &hex(KEY_INFO)).unwrap();
    assert_eq!(suite::secret_of(&server), hex32(SK_SM));
    assert_eq!(
        suite::encode_element(&server.get_public_key()),
        hex32(PK_SM)
    );
    // A key read back from its secret has the same public key.
    let again = suite::server_from_secret(&hex32(SK_SM)).unwrap();
    assert_eq!(again.get_public_key(), server.get_public_key());
}

#[test]
fn rfc_9497_voprf_ristretto255_sha512_vectors() {
    let server = suite::derive_key_pair(&hex32(SEED), &hex(KEY_INFO)).unwrap();
    let public_key = suite::decode_element(&hex(PK_SM)).unwrap();
    for (number, vector) in VECTORS.iter().enumerate() {
        let number = number + 1;
        let inputs: Vec<Vec<u8>> = vector.inputs.iter().map(|i| hex(i)).collect();

        // Blind, each input with its scripted blind.
        let mut rng = Scripted::new(vector.blinds);
        let mut clients: Vec<Client> = Vec::new();
        let mut blinded: Vec<Blinded> = Vec::new();
        for input in &inputs {
            let (client, element) = suite::blind(input, &mut rng).unwrap();
            clients.push(client);
            blinded.push(element);
        }
        let blinded_bytes: Vec<Vec<u8>> = blinded.iter().map(|e| e.serialize().to_vec()).collect();
        let expected: Vec<Vec<u8>> = vector.blinded_elements.iter().map(|e| hex(e)).collect();
        assert_eq!(blinded_bytes, expected, "vector {number}: BlindedElement");

        // BlindEvaluate over the batch, with the scripted proof scalar.
        let mut rng = Scripted::new(&[vector.proof_random_scalar]);
        let (evaluated, proof) = suite::blind_evaluate_batch(&server, &blinded, &mut rng).unwrap();
        let evaluated_bytes: Vec<Vec<u8>> =
            evaluated.iter().map(|e| e.serialize().to_vec()).collect();
        let expected: Vec<Vec<u8>> = vector.evaluation_elements.iter().map(|e| hex(e)).collect();
        assert_eq!(
            evaluated_bytes, expected,
            "vector {number}: EvaluationElement"
        );
        assert_eq!(
            suite::encode_proof(&proof).to_vec(),
            hex(vector.proof),
            "vector {number}: Proof"
        );
        let decoded = suite::decode_proof(&hex(vector.proof)).unwrap();
        assert_eq!(decoded, proof, "vector {number}: the proof decodes");

        // Finalize (verifies the proof against pkSm), and Evaluate on the server alone.
        let outputs = suite::finalize_batch(&inputs, &clients, &evaluated, &proof, public_key)
            .unwrap()
            .expect("the RFC's proof verifies");
        let expected: Vec<Vec<u8>> = vector.outputs.iter().map(|o| hex(o)).collect();
        let got: Vec<Vec<u8>> = outputs.iter().map(|o| o.to_vec()).collect();
        assert_eq!(got, expected, "vector {number}: Output (Finalize)");
        for (input, output) in inputs.iter().zip(&expected) {
            assert_eq!(
                suite::evaluate(&server, input).unwrap().to_vec(),
                *output,
                "vector {number}: Output (Evaluate)"
            );
        }
    }
}

#[test]
fn a_proof_from_another_key_does_not_verify() {
    // Vector 3's elements evaluated under another key: finalize must report the proof as
    // failed (Ok(None)), not return outputs.
    let server = suite::derive_key_pair(&hex32(SEED), &hex(KEY_INFO)).unwrap();
    let other = suite::derive_key_pair(&[7u8; 32], &hex(KEY_INFO)).unwrap();
    let vector = &VECTORS[2];
    let inputs: Vec<Vec<u8>> = vector.inputs.iter().map(|i| hex(i)).collect();
    let mut rng = Scripted::new(vector.blinds);
    let (clients, blinded): (Vec<Client>, Vec<Blinded>) = inputs
        .iter()
        .map(|input| suite::blind(input, &mut rng).unwrap())
        .unzip();
    let mut rng = Scripted::new(&[vector.proof_random_scalar]);
    let (evaluated, proof) = suite::blind_evaluate_batch(&other, &blinded, &mut rng).unwrap();
    let outcome = suite::finalize_batch(
        &inputs,
        &clients,
        &evaluated,
        &proof,
        server.get_public_key(),
    )
    .unwrap();
    assert!(outcome.is_none());
}
