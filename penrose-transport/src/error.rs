//! Typed failures of the server, the client and identity files.

use std::path::PathBuf;

use penrose_core::wire::WireError;
use thiserror::Error;

/// Why an endpoint could not be set up.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The UDP socket could not be bound.
    #[error("cannot bind the QUIC endpoint on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// What the system said.
        source: std::io::Error,
    },
    /// TLS refused the certificate, the key or the settings.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// QUIC refused the TLS configuration (it needs TLS 1.3 and an initial cipher suite).
    #[error("QUIC cannot use this TLS configuration: {0}")]
    QuicTls(String),
    /// The limits do not make sense (a zero where a count must be positive, a value QUIC
    /// cannot encode).
    #[error("invalid limits: {0}")]
    InvalidLimits(&'static str),
    /// The identity could not be made or read.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// Why a server identity or a trust anchor could not be made, read or written.
#[derive(Debug, Error)]
pub enum IdentityError {
    /// The certificate could not be generated.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file held no certificate.
    #[error("{0}: no certificate found")]
    NoCertificate(PathBuf),
    /// A file held no private key, or one of a kind this build cannot read.
    #[error("{path}: no usable private key: {reason}")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// A PEM file could not be parsed.
    #[error("{path}: malformed PEM: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
}

/// Why a report could not be delivered, or its ack not read.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The client endpoint could not be bound or configured.
    #[error(transparent)]
    Setup(#[from] TransportError),
    /// The connection attempt was refused before any packet was sent.
    #[error("cannot start a connection: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The handshake failed or the connection was lost (a certificate that does not match the
    /// pin, a wrong ALPN, the server refusing or going away, a timeout).
    #[error("connection failed: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// No handshake within the connect timeout (no server there, or packets lost).
    #[error("no connection within {0:?}")]
    ConnectTimeout(std::time::Duration),
    /// Writing the report failed.
    #[error("writing the report: {0}")]
    Write(#[from] quinn::WriteError),
    /// Reading the ack failed (the stream was reset, for instance after a server-side
    /// timeout, or the connection was lost).
    #[error("reading the ack: {0}")]
    Read(#[from] quinn::ReadToEndError),
    /// The server finished its side without a complete ack, or sent more than one.
    #[error("the server's reply is not one ack frame: {0}")]
    BadAck(#[source] WireError),
    /// The server's reply decoded to a message that is not an ack.
    #[error("the server replied with a message that is not an ack")]
    NotAnAck,
    /// The server answered a request (a key list request) with an ack: it does not serve it.
    #[error("the server refused the request: {0:?}")]
    Refused(penrose_core::wire::AckStatus),
    /// No ack within the ack timeout.
    #[error("no ack within {0:?}")]
    AckTimeout(std::time::Duration),
    /// The ack names another report.
    #[error("the ack is for another report")]
    AckMismatch,
    /// The report cannot be encoded (too large for a frame).
    #[error("cannot encode the report: {0}")]
    Encode(#[source] WireError),
    /// No stream to the server could be opened for a carried connection
    /// ([`crate::client::Route::Carried`]): over Tor, no circuit or the exit could not connect.
    #[error("cannot open a stream to the server: {0}")]
    Carrier(#[source] std::io::Error),
    /// The client was configured with a combination that cannot work.
    #[error("unsupported client configuration: {0}")]
    Unsupported(&'static str),
    /// An exchange endpoint's answer is not one length-prefixed body within the limit.
    #[error("the server's answer is malformed: {0}")]
    BadAnswer(&'static str),
    /// The request is larger than the exchange endpoint reads.
    #[error("a request of {0} bytes is larger than the endpoint reads")]
    RequestTooLarge(usize),
    /// Every attempt failed; the last failure is kept.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// Why the last one failed.
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// Whether trying again, perhaps on a new connection, might succeed. A certificate that
    /// does not match, an unencodable report or a reply that breaks the protocol will not get
    /// better by retrying.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connection(e) => match e {
                // Certificate, ALPN and other TLS failures, seen here or by the server.
                quinn::ConnectionError::TransportError(_)
                | quinn::ConnectionError::VersionMismatch => false,
                quinn::ConnectionError::ConnectionClosed(close) => !is_tls_alert(close.error_code),
                // Refused (server full), closed by the application (shutdown), reset, timed
                // out, or closed here.
                _ => true,
            },
            // A fresh connection's socket could not be bound (ports exhausted, say): later,
            // one may be free.
            ClientError::Setup(TransportError::Bind { .. }) => true,
            ClientError::ConnectTimeout(_)
            | ClientError::Write(_)
            | ClientError::Read(_)
            | ClientError::AckTimeout(_)
            | ClientError::Carrier(_) => true,
            ClientError::Setup(_)
            | ClientError::Connect(_)
            | ClientError::BadAck(_)
            | ClientError::NotAnAck
            | ClientError::Refused(_)
            | ClientError::AckMismatch
            | ClientError::Encode(_)
            | ClientError::BadAnswer(_)
            | ClientError::RequestTooLarge(_)
            | ClientError::Unsupported(_)
            | ClientError::RetriesExhausted { .. } => false,
        }
    }
}

/// QUIC carries TLS alerts as transport error codes 0x100 to 0x1ff (RFC 9001, section 4.8).
fn is_tls_alert(code: quinn::TransportErrorCode) -> bool {
    (0x100..0x200).contains(&u64::from(code))
}
