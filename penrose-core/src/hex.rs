//! The one text form of byte strings (ids, keys, hashes) across the tiers: lower-case hex,
//! two digits a byte, no prefix. Every crate writes and reads ids through these two functions,
//! so that a value printed by one tool is accepted by another.
//!
//! The identifiers themselves own their text form: [`SnippetHash`], [`ReportId`] and
//! [`KeyId`] implement `Display` (this hex, every byte), `FromStr` (exactly their length in
//! hex, either case, refused with a [`ParseIdError`] that names the kind of id) and serde as
//! that same string, so nobody else writes or parses their hex.
//!
//! [`SnippetHash`]: crate::fingerprint::SnippetHash
//! [`ReportId`]: crate::wire::ReportId
//! [`KeyId`]: crate::paillier::KeyId

use thiserror::Error;

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

/// Text that is not the hex form of an identifier.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{text:?} is not a {what}: expected {digits} hex digits")]
pub struct ParseIdError {
    /// What was expected ("snippet hash", "report id", "key id").
    pub what: &'static str,
    /// How many hex digits it has.
    pub digits: usize,
    /// The text refused (at most its first 80 characters).
    pub text: String,
}

impl ParseIdError {
    fn new(what: &'static str, digits: usize, text: &str) -> Self {
        ParseIdError {
            what,
            digits,
            text: text.chars().take(80).collect(),
        }
    }
}

/// Parses the text form of an `N`-byte identifier called `what` (used by the identifiers'
/// `FromStr`).
pub fn parse_id<const N: usize>(what: &'static str, text: &str) -> Result<[u8; N], ParseIdError> {
    decode_array(text).ok_or_else(|| ParseIdError::new(what, 2 * N, text))
}

/// Implements `Display`, `FromStr` and serde (as the same string) for a tuple struct around
/// `[u8; N]`, in the hex form of this module.
macro_rules! text_id {
    ($ty:ty, $what:literal) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&$crate::hex::encode(&self.0))
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::hex::ParseIdError;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                $crate::hex::parse_id($what, text).map(Self)
            }
        }

        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Self, D::Error> {
                let text = <String as ::serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use text_id;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fingerprint::SnippetHash;
    use crate::paillier::KeyId;
    use crate::wire::ReportId;

    #[test]
    fn identifiers_print_and_parse_one_text_form() {
        let report = ReportId([0xa5; 16]);
        let text = report.to_string();
        assert_eq!(text, "a5".repeat(16));
        assert_eq!(text.parse::<ReportId>(), Ok(report));
        assert_eq!(text.to_uppercase().parse::<ReportId>(), Ok(report));
        let snippet = SnippetHash(std::array::from_fn(|i| i as u8));
        assert_eq!(snippet.to_string().parse::<SnippetHash>(), Ok(snippet));
        assert!(snippet.to_string().starts_with("000102"));
        let key = KeyId([0xff; 32]);
        assert_eq!(key.to_string().len(), 64);
        assert_eq!(key.to_string().parse::<KeyId>(), Ok(key));

        // Exactly their length: a report id is not a snippet hash, a prefix is not an id.
        let err = text.parse::<SnippetHash>().unwrap_err();
        assert_eq!((err.what, err.digits), ("snippet hash", 64));
        assert!(err.to_string().contains("snippet hash"), "{err}");
        assert!(text[..30].parse::<ReportId>().is_err());
        assert!(format!("0x{}", &text[2..]).parse::<ReportId>().is_err());
        assert!(format!(" {}", &text[1..]).parse::<ReportId>().is_err());
        assert!("".parse::<KeyId>().is_err());
    }

    #[test]
    fn identifiers_serialise_as_their_text_form() {
        let report = ReportId([0x0f; 16]);
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(json, format!("\"{}\"", "0f".repeat(16)));
        assert_eq!(serde_json::from_str::<ReportId>(&json).unwrap(), report);
        // Also from a string with escapes (not borrowed from the input).
        let escaped = format!("\"\\u0030{}\"", &"0f".repeat(16)[1..]);
        assert_eq!(serde_json::from_str::<ReportId>(&escaped).unwrap(), report);
        let err = serde_json::from_str::<ReportId>("\"0f\"").unwrap_err();
        assert!(err.to_string().contains("report id"), "{err}");
        assert!(serde_json::from_str::<ReportId>("15").is_err());
    }

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
