//! Feeds arbitrary bytes to the design key list decoder an agent runs on what the aggregation
//! server hands it. Two ways in: as received (the signature check must refuse it, never
//! panic), and as a body signed here with a fixed key, so that the parser behind the
//! signature check (key count, days, public keys) sees arbitrary input too. Whatever verifies
//! must sign again to the same bytes.
#![no_main]

use ed25519_dalek::{Signer, SigningKey};
use libfuzzer_sys::fuzz_target;
use penrose_core::key_list::KeyList;

fuzz_target!(|data: &[u8]| {
    let signing = SigningKey::from_bytes(&[7; 32]);
    let signer = signing.verifying_key();
    let _ = KeyList::verify(data, &signer);
    let mut signed = data.to_vec();
    signed.extend_from_slice(&signing.sign(data).to_bytes());
    if let Ok(list) = KeyList::verify(&signed, &signer) {
        assert_eq!(list.sign(&signing), signed);
    }
});
