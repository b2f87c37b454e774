//! The one text form of byte strings (ids, keys, hashes) across the tiers: lower-case hex,
//! two digits a byte, no prefix. Every crate writes and reads ids through these two functions,
//! so that a value printed by one tool is accepted by another.

/// `bytes` as lower-case hex.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Parses an even number of hex digits (either case); `None` for anything else (a sign, a
/// space: `u8::from_str_radix` alone would accept "+f").
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// Parses exactly `N` bytes of hex.
pub fn decode_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    decode(text)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(encode(&bytes), "000fa5ff");
        assert_eq!(decode("000fA5ff"), Some(bytes.to_vec()));
        assert_eq!(decode_array::<4>("000fa5ff"), Some(bytes));
        assert_eq!(decode_array::<3>("000fa5ff"), None);
        for bad in ["0", "zz", "é1", "+1", " 1"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
