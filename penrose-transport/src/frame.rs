//! Reading one frame from a QUIC stream without trusting the peer: the length prefix is
//! checked before the body is allocated, and the stream must end right after the body.

use penrose_core::wire::LENGTH_PREFIX;
use quinn::{ReadError, ReadExactError, RecvStream};

/// What arrived on a report stream.
pub(crate) enum FrameRead {
    /// One complete body of an allowed length, and then the end of the stream.
    Body(Vec<u8>),
    /// The prefix announced more than the endpoint's limit; nothing was allocated.
    TooLarge(usize),
    /// The stream ended before the prefix or the announced body was complete.
    Truncated,
    /// Bytes followed the body: one stream carries one frame.
    Trailing,
}

/// Reads one length-prefixed body of at most `max` bytes (the report endpoint's limit is
/// [`penrose_core::wire::MAX_FRAME_BODY`]; an exchange endpoint sets its own).
pub(crate) async fn read_frame(recv: &mut RecvStream, max: usize) -> Result<FrameRead, ReadError> {
    let mut prefix = [0u8; LENGTH_PREFIX];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(_)) => return Ok(FrameRead::Truncated),
        Err(ReadExactError::ReadError(e)) => return Err(e),
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Ok(FrameRead::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    match recv.read_exact(&mut body).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(_)) => return Ok(FrameRead::Truncated),
        Err(ReadExactError::ReadError(e)) => return Err(e),
    }
    let mut probe = [0u8; 1];
    match recv.read(&mut probe).await? {
        None => Ok(FrameRead::Body(body)),
        Some(_) => Ok(FrameRead::Trailing),
    }
}
