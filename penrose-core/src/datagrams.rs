//! QUIC datagrams on a byte stream: the framing of the Tor path (docs/transport.md, "Over
//! Tor"). Tor carries TCP streams only, so each datagram travels as a 2-byte big-endian length
//! and its bytes. The server's stream port reads whatever a peer sends with [`Decoder`], so
//! this is a decoder that faces the network: it never allocates more than one announced
//! datagram beyond what it was given, and a length of zero or above [`MAX_DATAGRAM`] is an
//! error after which the stream is closed.

use thiserror::Error;

/// The longest datagram a stream carries: the largest UDP payload QUIC may ask for.
pub const MAX_DATAGRAM: usize = 65_527;

/// Bytes of the length before each datagram.
pub const PREFIX: usize = 2;

/// A length that no datagram may have.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("a datagram of {0} bytes (1 to 65,527 allowed)")]
pub struct BadLength(pub usize);

/// Appends `datagram`, framed, to `out`.
pub fn encode(datagram: &[u8], out: &mut Vec<u8>) -> Result<(), BadLength> {
    let len = datagram.len();
    let prefix = u16::try_from(len)
        .ok()
        .filter(|_| (1..=MAX_DATAGRAM).contains(&len))
        .ok_or(BadLength(len))?;
    out.extend_from_slice(&prefix.to_be_bytes());
    out.extend_from_slice(datagram);
    Ok(())
}

/// Splits a byte stream back into datagrams, whatever pieces it arrives in.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Where the next undecoded byte of `buf` is.
    start: usize,
}

impl Decoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Takes the next bytes of the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > MAX_DATAGRAM {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole datagram; `Ok(None)` until its last byte has been pushed. After an
    /// error the stream cannot be resynchronised: close it.
    pub fn next_datagram(&mut self) -> Result<Option<Vec<u8>>, BadLength> {
        let pending = &self.buf[self.start..];
        let Some((prefix, rest)) = pending.split_first_chunk::<PREFIX>() else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes(*prefix));
        if !(1..=MAX_DATAGRAM).contains(&len) {
            return Err(BadLength(len));
        }
        let Some(datagram) = rest.get(..len) else {
            return Ok(None);
        };
        let datagram = datagram.to_vec();
        self.start += PREFIX + len;
        Ok(Some(datagram))
    }

    /// Bytes pushed and not yet returned as datagrams.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_come_back_whole_whatever_the_pieces() {
        let datagrams: Vec<Vec<u8>> = [1usize, 2, 1200, 65_527, 3]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let mut stream = Vec::new();
        for d in &datagrams {
            encode(d, &mut stream).unwrap();
        }
        for piece in [1usize, 2, 3, 1000, stream.len()] {
            let mut decoder = Decoder::new();
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                decoder.push(chunk);
                while let Some(d) = decoder.next_datagram().unwrap() {
                    got.push(d);
                }
            }
            assert_eq!(got, datagrams, "pieces of {piece}");
            assert_eq!(decoder.buffered(), 0);
        }
    }

    #[test]
    fn bad_lengths_are_refused_both_ways() {
        let mut out = Vec::new();
        assert_eq!(encode(&[], &mut out), Err(BadLength(0)));
        assert_eq!(encode(&vec![0; 65_528], &mut out), Err(BadLength(65_528)));
        assert!(out.is_empty(), "nothing written for a refused datagram");
        for prefix in [[0u8, 0], [0xff, 0xf8], [0xff, 0xff]] {
            let mut decoder = Decoder::new();
            decoder.push(&prefix);
            assert!(decoder.next_datagram().is_err(), "{prefix:?}");
        }
        let mut decoder = Decoder::new();
        decoder.push(&[0xff, 0xf7]);
        assert_eq!(
            decoder.next_datagram(),
            Ok(None),
            "65,527 is allowed, waits"
        );
    }
}
