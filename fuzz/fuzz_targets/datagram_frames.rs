//! Feeds arbitrary bytes, in arbitrary pieces, to the stream port's datagram decoder (the Tor
//! path, `penrose_core::datagrams`): it must never panic, must find the same datagrams however
//! the bytes are cut, and every datagram it returns must re-encode to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use penrose_core::datagrams::{Decoder, encode};

fn decode(data: &[u8], piece: usize) -> (Vec<Vec<u8>>, bool) {
    let mut decoder = Decoder::new();
    let mut out = Vec::new();
    for chunk in data.chunks(piece.max(1)) {
        decoder.push(chunk);
        loop {
            match decoder.next_datagram() {
                Ok(Some(datagram)) => out.push(datagram),
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fuzz_target!(|input: &[u8]| {
    let Some((&piece, data)) = input.split_first() else {
        return;
    };
    let whole = decode(data, data.len());
    let pieces = decode(data, usize::from(piece));
    assert_eq!(whole, pieces, "the cut changed what was decoded");
    let mut again = Vec::new();
    for datagram in &whole.0 {
        encode(datagram, &mut again).expect("a decoded datagram re-encodes");
    }
    assert_eq!(again, data[..again.len()], "datagrams re-encode to their bytes");
});
