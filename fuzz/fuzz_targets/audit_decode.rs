//! Feeds arbitrary bytes to the release auditor's protocol decoders: requests, as the
//! auditor's endpoint reads them from the network, and answers, as the design server reads
//! them. Neither may panic or allocate past what the bytes hold; whatever decodes must encode
//! back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use penrose_core::audit::{AuditAnswer, AuditRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = AuditRequest::decode(data) {
        assert_eq!(request.encode(), data);
    }
    if let Ok(answer) = AuditAnswer::decode(data) {
        assert_eq!(answer.encode(), data);
    }
});
