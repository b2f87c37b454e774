//! Prometheus metrics: counters the ingest path bumps with relaxed atomics, rendered in the
//! Prometheus text format by a minimal HTTP/1.1 responder on a local port.
//!
//! The responder answers every request with the metrics page and closes the connection; it
//! reads at most one request head of 8 KiB, with a timeout, so a slow or hostile scraper
//! costs one small task.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use penrose_core::wire::RejectReason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::store::TableSize;

/// Upper edges of the ingest latency histogram, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];

/// Every reject reason a build knows, in code order (index = code - 1).
pub const REASONS: [RejectReason; 16] = [
    RejectReason::UnsupportedVersion,
    RejectReason::Malformed,
    RejectReason::TooLarge,
    RejectReason::UnknownKey,
    RejectReason::UnknownCounter,
    RejectReason::InvalidCiphertext,
    RejectReason::SampleCountOutOfRange,
    RejectReason::Overloaded,
    RejectReason::DayOutOfRange,
    RejectReason::InvalidSnippet,
    RejectReason::NewClassLimit,
    RejectReason::TokenRequired,
    RejectReason::InvalidToken,
    RejectReason::TokenSpent,
    RejectReason::TokenKeyMissing,
    RejectReason::InvalidArch,
];

/// The server's counters and gauges.
#[derive(Default)]
pub struct Metrics {
    /// Reports stored and counted.
    pub accepted: AtomicU64,
    /// Reports answered as duplicates.
    pub duplicates: AtomicU64,
    /// One counter per reason of [`REASONS`], and one for reasons this build does not know.
    rejected: [AtomicU64; REASONS.len() + 1],
    /// Admission tokens whose MAC verified (each then spent, or its report refused by the
    /// writer as `TokenSpent` or another reason).
    pub tokens_verified: AtomicU64,
    /// Key list requests answered with the design server's signed list.
    pub key_lists_served: AtomicU64,
    /// Frame bytes received by ingest.
    pub bytes: AtomicU64,
    /// Durable write batches committed.
    pub batches: AtomicU64,
    /// Microseconds spent in durable writes (WAL sync included), on the committer thread.
    pub write_micros: AtomicU64,
    /// Microseconds the writer spent preparing batches (unit check, dedupe, classes, sums).
    pub aggregate_micros: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_micros: AtomicU64,
    /// Classes in the EST.
    pub classes: AtomicU64,
    /// Distinct snippet hashes in the SST.
    pub snippets: AtomicU64,
    /// Open accumulators.
    pub accumulators: AtomicU64,
    /// Classes that may still be founded now (the new-class budget).
    pub class_budget: AtomicU64,
    /// The Seen floor: the oldest report day the deduplication record keeps.
    pub seen_floor: AtomicU64,
}

impl Metrics {
    /// Updates the gauges that describe the aggregation state.
    pub fn set_state(&self, state: &mut crate::state::State) {
        let tables = state.tables();
        self.classes
            .store(tables.class_count() as u64, Ordering::Relaxed);
        self.snippets
            .store(tables.snippet_count(), Ordering::Relaxed);
        self.accumulators
            .store(state.sums().open_count() as u64, Ordering::Relaxed);
        self.seen_floor
            .store(u64::from(state.seen_floor().0), Ordering::Relaxed);
        let budget = state
            .new_class_budget()
            .available(std::time::Instant::now());
        self.class_budget.store(budget, Ordering::Relaxed);
    }

    /// Counts one rejection.
    pub fn rejected(&self, reason: RejectReason) {
        let index = REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REASONS.len());
        self.rejected[index].fetch_add(1, Ordering::Relaxed);
    }

    /// Rejections so far for `reason` (reasons this build does not know count together).
    pub fn rejected_count(&self, reason: RejectReason) -> u64 {
        let index = REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REASONS.len());
        self.rejected[index].load(Ordering::Relaxed)
    }

    /// Records one report's time from arrival to ack.
    pub fn observe_latency(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&edge| secs <= edge)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
        self.latency_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The Prometheus text exposition of every metric, with the store's table sizes.
    pub fn render(&self, sizes: &[TableSize]) -> String {
        let mut out = String::new();
        self.render_counters(&mut out);
        self.render_latency(&mut out);
        self.render_gauges(&mut out, sizes);
        render_store(&mut out, sizes);
        out
    }

    fn render_counters(&self, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        metric(
            out,
            "penrose_reports_accepted_total",
            "counter",
            "Reports stored durably and counted.",
            &[(String::new(), get(&self.accepted))],
        );
        metric(
            out,
            "penrose_reports_duplicate_total",
            "counter",
            "Reports answered as duplicates of one already counted.",
            &[(String::new(), get(&self.duplicates))],
        );
        let mut rejected: Vec<(String, u64)> = REASONS
            .iter()
            .zip(&self.rejected)
            .map(|(r, c)| (format!("{{reason=\"{}\"}}", reason_label(*r)), get(c)))
            .collect();
        rejected.push((
            "{reason=\"other\"}".into(),
            get(&self.rejected[REASONS.len()]),
        ));
        metric(
            out,
            "penrose_reports_rejected_total",
            "counter",
            "Reports refused, by reason.",
            &rejected,
        );
        let simple = [
            (
                "penrose_tokens_verified_total",
                "Admission tokens verified (refusals are in penrose_reports_rejected_total: \
                 token_required, invalid_token, token_spent).",
                &self.tokens_verified,
            ),
            (
                "penrose_key_lists_served_total",
                "Key list requests answered with the design server's signed list.",
                &self.key_lists_served,
            ),
            (
                "penrose_ingest_bytes_total",
                "Frame bytes received.",
                &self.bytes,
            ),
            (
                "penrose_write_batches_total",
                "Durable write batches committed.",
                &self.batches,
            ),
            (
                "penrose_write_seconds_micros_total",
                "Microseconds spent in durable writes, WAL sync included.",
                &self.write_micros,
            ),
            (
                "penrose_aggregate_seconds_micros_total",
                "Microseconds the writer spent aggregating batches (unit check, deduplication, \
                 classes, sums), overlapping the previous batch's write.",
                &self.aggregate_micros,
            ),
        ];
        for (name, help, value) in simple {
            metric(out, name, "counter", help, &[(String::new(), get(value))]);
        }
    }

    fn render_latency(&self, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP penrose_ingest_latency_seconds Time from a report's arrival to its ack."
        );
        let _ = writeln!(out, "# TYPE penrose_ingest_latency_seconds histogram");
        let mut cumulative = 0;
        for (edge, count) in LATENCY_BUCKETS.iter().zip(&self.latency) {
            cumulative += get(count);
            let _ = writeln!(
                out,
                "penrose_ingest_latency_seconds_bucket{{le=\"{edge}\"}} {cumulative}"
            );
        }
        cumulative += get(&self.latency[LATENCY_BUCKETS.len()]);
        let _ = writeln!(
            out,
            "penrose_ingest_latency_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(
            out,
            "penrose_ingest_latency_seconds_sum {}",
            get(&self.latency_micros) as f64 / 1e6
        );
        let _ = writeln!(out, "penrose_ingest_latency_seconds_count {cumulative}");
    }

    fn render_gauges(&self, out: &mut String, sizes: &[TableSize]) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gauges = [
            ("penrose_classes", "Application classes.", &self.classes),
            (
                "penrose_snippets",
                "Distinct snippet hashes.",
                &self.snippets,
            ),
            (
                "penrose_open_accumulators",
                "Open accumulators (one per class and counter).",
                &self.accumulators,
            ),
            (
                "penrose_new_class_budget",
                "Classes that may still be founded now (refills at --new-classes-per-hour).",
                &self.class_budget,
            ),
            (
                "penrose_seen_floor_day",
                "Oldest report day the deduplication record keeps (days since 1970).",
                &self.seen_floor,
            ),
        ];
        for (name, help, value) in gauges {
            gauge(out, name, help, get(value));
        }
        if let Some(spent) = sizes.iter().find(|s| s.table == "spent") {
            gauge(
                out,
                "penrose_spent_tokens",
                "Spent admission tokens remembered (estimated keys of the spent table; they \
                 expire with their day).",
                spent.keys,
            );
        }
    }
}

/// One metric's HELP, TYPE and lines.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, lines: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in lines {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// One gauge without labels.
fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    metric(out, name, "gauge", help, &[(String::new(), value)]);
}

/// One counter without labels.
fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    metric(out, name, "counter", help, &[(String::new(), value)]);
}

/// The store's bytes and keys per table.
fn render_store(out: &mut String, sizes: &[TableSize]) {
    let bytes: Vec<(String, u64)> = sizes
        .iter()
        .flat_map(|size| {
            [("disk", size.disk_bytes), ("memtable", size.memtable_bytes)]
                .map(|(kind, n)| (format!("{{table=\"{}\",kind=\"{kind}\"}}", size.table), n))
        })
        .collect();
    metric(
        out,
        "penrose_store_bytes",
        "gauge",
        "Bytes of each store table on disk and in memtables.",
        &bytes,
    );
    let keys: Vec<(String, u64)> = sizes
        .iter()
        .map(|size| (format!("{{table=\"{}\"}}", size.table), size.keys))
        .collect();
    metric(
        out,
        "penrose_store_keys",
        "gauge",
        "Estimated keys in each store table.",
        &keys,
    );
}

/// The transport's counters (connections, Retries, per-source refusals, handshakes, frames)
/// in the Prometheus text format, to follow [`Metrics::render`] on the metrics page.
pub fn render_transport(stats: &penrose_transport::ServerStats) -> String {
    let mut out = String::new();
    metric(
        &mut out,
        "penrose_transport_connections_total",
        "counter",
        "Connection attempts by what became of them.",
        &outcomes(&[
            ("accepted", stats.connections_accepted),
            ("retry_sent", stats.retries_sent),
            ("refused_source_open", stats.refused_source_open),
            ("refused_source_rate", stats.refused_source_rate),
            ("refused_server_full", stats.connections_refused),
            ("handshake_timeout", stats.handshake_timeouts),
            ("handshake_failed", stats.handshakes_failed),
        ]),
    );
    gauge(
        &mut out,
        "penrose_transport_connections_open",
        "Connections open now (handshake done).",
        stats.connections_open,
    );
    gauge(
        &mut out,
        "penrose_transport_udp_receive_buffer_bytes",
        "UDP receive buffer the kernel granted (udp_receive_buffer asks; net.core.rmem_max caps).",
        stats.udp_receive_buffer,
    );
    counter(
        &mut out,
        "penrose_transport_udp_drops_total",
        "Datagrams the kernel dropped at the full UDP receive buffer (each sent again, late).",
        stats.udp_drops,
    );
    metric(
        &mut out,
        "penrose_transport_streams_total",
        "counter",
        "Report streams by what became of them.",
        &outcomes(&[
            ("opened", stats.streams),
            ("handled", stats.frames_handled),
            ("too_large", stats.frames_too_large),
            ("malformed", stats.frames_malformed),
            ("read_timeout", stats.read_timeouts),
            ("error", stats.stream_errors),
            ("paced", stats.streams_paced),
            ("acked", stats.acks_sent),
        ]),
    );
    render_carrier(&mut out, &stats.carrier);
    out
}

/// The stream port's counters (`--stream-listen`).
fn render_carrier(out: &mut String, c: &penrose_transport::carrier::CarrierStats) {
    metric(
        out,
        "penrose_transport_carrier_streams_total",
        "counter",
        "TCP streams on the stream port (--stream-listen, where Tor exits deliver) by what \
         became of them.",
        &outcomes(&[
            ("accepted", c.streams),
            ("refused_server_full", c.streams_refused),
            ("idle", c.streams_idle),
            ("malformed", c.streams_malformed),
        ]),
    );
    counter(
        out,
        "penrose_transport_carrier_datagrams_dropped_total",
        "Datagrams on the stream port dropped at a full queue or a closed stream (QUIC sends \
         them again).",
        c.datagrams_dropped,
    );
}

/// One line per outcome, labelled `outcome="..."`.
fn outcomes(values: &[(&str, u64)]) -> Vec<(String, u64)> {
    values
        .iter()
        .map(|(outcome, value)| (format!("{{outcome=\"{outcome}\"}}"), *value))
        .collect()
}

/// The label of a reject reason in metrics and JSON.
pub fn reason_label(reason: RejectReason) -> &'static str {
    match reason {
        RejectReason::UnsupportedVersion => "unsupported_version",
        RejectReason::Malformed => "malformed",
        RejectReason::TooLarge => "too_large",
        RejectReason::UnknownKey => "unknown_key",
        RejectReason::UnknownCounter => "unknown_counter",
        RejectReason::InvalidCiphertext => "invalid_ciphertext",
        RejectReason::SampleCountOutOfRange => "sample_count_out_of_range",
        RejectReason::Overloaded => "overloaded",
        RejectReason::DayOutOfRange => "day_out_of_range",
        RejectReason::InvalidSnippet => "invalid_snippet",
        RejectReason::NewClassLimit => "new_class_limit",
        RejectReason::TokenRequired => "token_required",
        RejectReason::InvalidToken => "invalid_token",
        RejectReason::TokenSpent => "token_spent",
        RejectReason::TokenKeyMissing => "token_key_missing",
        RejectReason::InvalidArch => "invalid_arch",
        RejectReason::Other(_) => "other",
    }
}

/// Serves `page()` to every HTTP request on `listener` until the task is dropped.
pub async fn serve_http<F>(listener: TcpListener, page: F)
where
    F: Fn() -> String + Send + Sync + Clone + 'static,
{
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let page = page.clone();
        tokio::spawn(async move {
            let mut head = vec![0u8; 8 * 1024];
            let mut read = 0;
            // Read until the end of the request head, the buffer is full, or 5 s pass.
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                while read < head.len() {
                    match stream.read(&mut head[read..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                    if head[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            let body = page();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn render_counts_reasons_and_latency() {
        let m = Metrics::default();
        m.accepted.fetch_add(3, Ordering::Relaxed);
        m.rejected(RejectReason::InvalidCiphertext);
        m.rejected(RejectReason::Other(99));
        m.observe_latency(Duration::from_millis(3));
        let text = m.render(&[]);
        assert!(text.contains("penrose_reports_accepted_total 3"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"invalid_ciphertext\"} 1"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"other\"} 1"));
        assert!(text.contains("penrose_ingest_latency_seconds_bucket{le=\"0.002\"} 0"));
        assert!(text.contains("penrose_ingest_latency_seconds_bucket{le=\"0.005\"} 1"));
        assert_eq!(m.rejected_count(RejectReason::InvalidCiphertext), 1);
        m.rejected(RejectReason::NewClassLimit);
        m.rejected(RejectReason::InvalidSnippet);
        m.rejected(RejectReason::TokenSpent);
        m.rejected(RejectReason::TokenRequired);
        m.rejected(RejectReason::TokenRequired);
        m.tokens_verified.fetch_add(5, Ordering::Relaxed);
        let spent = TableSize {
            table: "spent",
            keys: 42,
            disk_bytes: 0,
            memtable_bytes: 0,
        };
        let text = m.render(&[spent]);
        assert!(text.contains("penrose_reports_rejected_total{reason=\"new_class_limit\"} 1"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"invalid_snippet\"} 1"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"token_spent\"} 1"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"token_required\"} 2"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"invalid_token\"} 0"));
        assert!(text.contains("penrose_reports_rejected_total{reason=\"other\"} 1"));
        assert!(text.contains("penrose_tokens_verified_total 5"));
        assert!(text.contains("penrose_spent_tokens 42"));
        let transport = render_transport(&penrose_transport::ServerStats {
            retries_sent: 7,
            refused_source_rate: 2,
            udp_receive_buffer: 8 << 20,
            udp_drops: 3,
            ..Default::default()
        });
        assert!(transport.contains("penrose_transport_udp_receive_buffer_bytes 8388608"));
        assert!(transport.contains("penrose_transport_udp_drops_total 3"));
        assert!(
            transport.contains("penrose_transport_connections_total{outcome=\"retry_sent\"} 7")
        );
        assert!(
            transport
                .contains("penrose_transport_connections_total{outcome=\"refused_source_rate\"} 2")
        );
    }
}
