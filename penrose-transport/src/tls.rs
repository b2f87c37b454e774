//! rustls and quinn settings shared by both ends: TLS 1.3 only, the ring provider, ALPN
//! `penrose/1`, no 0-RTT (a replayed report would only be deduplicated, but there is no reason
//! to accept one), and transport windows sized for one frame per stream.

use std::sync::Arc;
use std::time::Duration;

use penrose_core::wire::{LENGTH_PREFIX, MAX_FRAME_BODY};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::ALPN;
use crate::error::TransportError;
use crate::identity::{Identity, Trust};
use crate::limits::Limits;

/// Receive window of one stream: one frame of the largest size, rounded up. A peer cannot get
/// more than this in flight on a stream before the server has read it.
const STREAM_WINDOW: u32 = 12 * 1024;
const _: () = assert!(STREAM_WINDOW as usize >= LENGTH_PREFIX + MAX_FRAME_BODY);

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
    if limits.stream_read_timeout.is_zero() || limits.idle_timeout.is_zero() {
        return Err(TransportError::InvalidLimits("timeouts must be positive"));
    }
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(identity.chain().to_vec(), identity.key().clone_key())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let crypto =
        QuicServerConfig::try_from(tls).map_err(|e| TransportError::QuicTls(e.to_string()))?;

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
    Ok(config)
}

pub(crate) fn client_config(
    trust: &Trust,
    alpn: &[u8],
    idle_timeout: Duration,
) -> Result<quinn::ClientConfig, TransportError> {
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
    tls.enable_early_data = false;
    let crypto =
        QuicClientConfig::try_from(tls).map_err(|e| TransportError::QuicTls(e.to_string()))?;

    let mut transport = TransportConfig::default();
    transport
        // The server never opens streams towards an agent.
        .max_concurrent_bidi_streams(VarInt::from_u32(0))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .max_idle_timeout(Some(idle(idle_timeout)?))
        .datagram_receive_buffer_size(None);
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
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
