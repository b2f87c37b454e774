//! Feeds arbitrary bytes to the decoder of a released sum's contributor evidence, as the
//! release auditor will read it from the network beside a bundle page. It may not panic or
//! reserve more than the bytes can hold; whatever decodes must encode back to the same bytes,
//! and each listed binding goes through the report decoder the auditor runs on it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use penrose_core::evidence::SumEvidence;
use penrose_core::wire::Report;

fuzz_target!(|data: &[u8]| {
    if let Ok(evidence) = SumEvidence::decode(data) {
        assert_eq!(evidence.encode(), data);
        for listed in evidence.reports() {
            if let Ok(report) = Report::from_binding(&listed.binding) {
                assert_eq!(report.token_binding(), listed.binding);
            }
        }
    }
});
