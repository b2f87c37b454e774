//! rustls and quinn settings shared by both ends: TLS 1.3 only, the ring provider, ALPN
//! `penrose/1`, no 0-RTT (a replayed report would only be deduplicated, but there is no reason
//! to accept one), and transport windows sized for one frame per stream.
//!
//! Nothing a handshake leaves behind can link it to a later one (docs/transport.md, "What
//! one upload looks like on the wire"): the server keeps no TLS sessions and issues no session
//! tickets (`NoServerSessionStorage`, `send_tls13_tickets = 0`, the builder's ticketer that
//! never produces tickets, no early data) and sends no QUIC address-validation tokens
//! (`NEW_TOKEN` frames: `ValidationTokenConfig::sent(0)`, and it ignores any it is shown);
//! the client stores neither (`Resumption::disabled()`, `NoneTokenStore`). The Retry token
//! the server sends to validate an address ([`crate::Limits::require_address_validation`]) is
//! another thing: quinn's client echoes it in the same connection attempt's second Initial
//! and never keeps it, and it is valid for that attempt only.

use std::sync::Arc;
use std::time::Duration;

use penrose_core::wire::{LENGTH_PREFIX, MAX_FRAME_BODY};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    IdleTimeout, NoneTokenLog, NoneTokenStore, TransportConfig, ValidationTokenConfig, VarInt,
};
use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::error::TransportError;
use crate::identity::{Identity, Trust};
use crate::limits::Limits;

/// Receive window of one stream: one frame of the largest size, rounded up. A peer cannot get
/// more than this in flight on a stream before the server has read it.
const STREAM_WINDOW: u32 = 12 * 1024;
const _: () = assert!(STREAM_WINDOW as usize >= LENGTH_PREFIX + MAX_FRAME_BODY);

/// Connection attempts quinn holds before the accept loop has decided them; beyond it new ones
/// are refused by quinn itself. Each holds its first datagram (about 1,200 bytes).
const INCOMING_ATTEMPTS: usize = 4096;

/// The shortest Retry token lifetime (quinn's tokens carry their issue time in whole seconds).
const MIN_RETRY_TOKEN_LIFETIME: Duration = Duration::from_secs(3);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn idle(timeout: Duration) -> Result<IdleTimeout, TransportError> {
    IdleTimeout::try_from(timeout)
        .map_err(|_| TransportError::InvalidLimits("idle timeout too large for QUIC"))
}

pub(crate) fn server_config(
    identity: &Identity,
    limits: &Limits,
    alpn: &[u8],
) -> Result<quinn::ServerConfig, TransportError> {
    if limits.max_connections == 0 || limits.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
        return Err(TransportError::InvalidLimits(
            "max_connections must be positive and below tokio's semaphore limit",
        ));
    }
    if limits.max_concurrent_streams == 0 {
        return Err(TransportError::InvalidLimits(
            "max_concurrent_streams must be positive",
        ));
    }
    if limits.stream_read_timeout.is_zero()
        || limits.idle_timeout.is_zero()
        || limits.handshake_timeout.is_zero()
    {
        return Err(TransportError::InvalidLimits("timeouts must be positive"));
    }
    if limits.max_connections_per_source == 0 {
        return Err(TransportError::InvalidLimits(
            "max_connections_per_source must be positive",
        ));
    }
    let crypto = QuicServerConfig::try_from(server_tls(identity, alpn)?)
        .map_err(|e| TransportError::QuicTls(e.to_string()))?;

    let mut transport = TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(limits.max_concurrent_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .max_idle_timeout(Some(idle(limits.idle_timeout)?))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(
            VarInt::from_u64(u64::from(STREAM_WINDOW) * u64::from(limits.max_concurrent_streams))
                .map_err(|_| TransportError::InvalidLimits("max_concurrent_streams too large"))?,
        )
        .datagram_receive_buffer_size(None);
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    // No address-validation tokens: a token handed out on one connection and shown on the next
    // would link the two. The server sends none and accepts none.
    let mut tokens = ValidationTokenConfig::default();
    tokens.sent(0).log(Arc::new(NoneTokenLog));
    config.validation_token_config(tokens);
    // Connection attempts not yet decided (the accept loop decides each at once: Retry,
    // refuse or accept): a bound on what a burst of Initials can make quinn hold.
    // A Retry token only has to survive the client's immediate echo (one round trip). Kept
    // short so that a client that stalls after validation cannot come back with the same
    // token once its abandoned attempt has drained and take a slot again; at least 3 s, as
    // quinn stamps tokens with whole seconds.
    config.retry_token_lifetime(limits.handshake_timeout.max(MIN_RETRY_TOKEN_LIFETIME));
    config
        .max_incoming(INCOMING_ATTEMPTS)
        .incoming_buffer_size(64 * 1024)
        .incoming_buffer_size_total(8 * 1024 * 1024);
    Ok(config)
}

/// The server's rustls configuration: TLS 1.3, the endpoint's one ALPN, and no resumption of
/// any kind (no session cache, no tickets, no early data).
fn server_tls(identity: &Identity, alpn: &[u8]) -> Result<rustls::ServerConfig, TransportError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(identity.chain().to_vec(), identity.key().clone_key())?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    // A TLS 1.3 server resumes only with a ticket it issued: it issues none, keeps no
    // sessions, and the builder's ticketer (kept as it is) never produces one.
    tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    tls.send_tls13_tickets = 0;
    tls.max_early_data_size = 0;
    Ok(tls)
}

pub(crate) fn client_config(
    trust: &Trust,
    alpn: &[u8],
    idle_timeout: Duration,
) -> Result<quinn::ClientConfig, TransportError> {
    let crypto = QuicClientConfig::try_from(client_tls(trust, alpn)?)
        .map_err(|e| TransportError::QuicTls(e.to_string()))?;

    let mut transport = TransportConfig::default();
    transport
        // The server never opens streams towards an agent.
        .max_concurrent_bidi_streams(VarInt::from_u32(0))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .max_idle_timeout(Some(idle(idle_timeout)?))
        .datagram_receive_buffer_size(None);
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    // Keep no address-validation token a server might send (ours sends none): showing it on
    // the next connection would link the two.
    config.token_store(Arc::new(NoneTokenStore));
    Ok(config)
}

/// The client's rustls configuration: TLS 1.3, the given ALPN, the trust anchor, and no
/// resumption (no session store, so no ticket is kept or offered, and no early data).
fn client_tls(trust: &Trust, alpn: &[u8]) -> Result<rustls::ClientConfig, TransportError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let mut tls = match trust {
        Trust::Pinned(cert) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                pinned: cert.clone(),
                algorithms: provider().signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        Trust::Ca(cas) => {
            let mut roots = RootCertStore::empty();
            for ca in cas {
                roots.add(ca.clone())?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    tls.alpn_protocols = vec![alpn.to_vec()];
    // Resumption would show the server a ticket it issued on an earlier connection; the
    // disabled store also keeps no key-exchange hint, so every ClientHello starts the same.
    tls.resumption = Resumption::disabled();
    tls.enable_early_data = false;
    Ok(tls)
}

/// Accepts exactly one certificate, byte for byte. The handshake signature is still checked
/// against that certificate's key, so only the holder of the pinned key gets through.
#[derive(Debug)]
struct PinnedVerifier {
    pinned: CertificateDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.pinned.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls13RequiredForQuic,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn neither_side_can_resume_a_session() {
        let identity = Identity::self_signed(["localhost"]).unwrap();
        let server = server_tls(&identity, crate::ALPN).unwrap();
        assert_eq!(server.send_tls13_tickets, 0);
        assert!(
            !server.ticketer.enabled(),
            "a ticketer that produces tickets"
        );
        assert!(
            !server.session_storage.can_cache(),
            "a server session cache"
        );
        assert_eq!(server.max_early_data_size, 0);
        for trust in [
            Trust::pin(&identity),
            Trust::Ca(vec![identity.certificate().clone()]),
        ] {
            let client = client_tls(&trust, crate::ALPN).unwrap();
            assert!(!client.enable_early_data);
            // `Resumption` has no accessors; its Debug names the store and the TLS 1.2 mode.
            let resumption = format!("{:?}", client.resumption);
            assert!(
                resumption.contains("NoClientSessionStorage") && resumption.contains("Disabled"),
                "{resumption}"
            );
        }
    }
}
