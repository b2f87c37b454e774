//! Feeds arbitrary bytes to the network-facing wire decoder: it must return errors, never
//! panic, and whatever it accepts must re-encode to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use penrose_core::wire::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok((message, used)) = Message::decode(data) {
        let again = message.to_frame().expect("a decoded message re-encodes");
        assert_eq!(again, &data[..used]);
    }
    let _ = Message::decode_body(data);
});
