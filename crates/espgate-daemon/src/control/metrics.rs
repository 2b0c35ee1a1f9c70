//! The Prometheus metrics endpoint (`gateway.metrics = "ADDR:PORT"`):
//! `GET /metrics` answers with the OpenMetrics text format (what
//! Prometheus asks for first), encoded by `prometheus-client` from the
//! same [`Status`] document `espgate status --json` returns, so the two
//! always agree. HTTP is `hyper`'s, on the control thread.
//!
//! `GET` and `HEAD` of `/metrics` (a query string is ignored) get 200;
//! another method on `/metrics` gets 405, any other path 404; hyper
//! answers a malformed request with 400 and oversized headers with 431.
//! Every answer closes the connection. A client has [`CLIENT_TIMEOUT`] to
//! send its request and read the answer, and at most [`MAX_CLIENTS`] are
//! served at once (more wait in the listen backlog), so silent clients
//! cost a socket each, never the tunnel or the control socket.
//!
//! Metric names follow the Prometheus conventions: `espgate_` prefix,
//! counters end in `_total`, units in the name (`_bytes`, `_seconds`).
//! Every drop reason ([`DropReason::ALL`] globally, [`DropReason::PER_SA`]
//! per SA) is always present, at 0 if nothing was dropped for it, so that
//! `rate()` and `increase()` work from the first scrape. While per-stage
//! cost accounting is on, `espgate_stage_seconds_total` and
//! `espgate_stage_packets_total` (labels `direction`, `stage`) export the
//! status document's `costs`; they are absent while it is off and restart
//! from 0 after `espgate costs reset` (a counter reset to Prometheus).

use super::accept::accept_loop;
use super::Control;
use espgate_api::costs::Dir;
use espgate_api::status::{Left, SaStatus, Status};
use espgate_core::DropReason;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Clients served at once; more wait in the listen backlog.
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take from connect to the end of the answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest request head read (hyper's smallest buffer).
pub const MAX_REQUEST: usize = 8192;
/// `Content-Type` of the metrics.
pub const METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The bound endpoint, before the control thread serves it.
#[derive(Debug)]
pub struct MetricsListener {
    listener: std::net::TcpListener,
    local: SocketAddr,
}

impl MetricsListener {
    /// Listens on `addr` (`SO_REUSEADDR`, as std sets it).
    pub fn bind(addr: SocketAddr) -> io::Result<MetricsListener> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok(MetricsListener { listener, local })
    }

    /// The address listened on (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// Serves the endpoint until the stop.
pub async fn serve(l: MetricsListener, ctl: Arc<Control>, stop: watch::Receiver<bool>) {
    let ctl: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(move || render(&ctl.status()));
    serve_with(l, ctl, stop).await;
}

/// [`serve`] with the exposition text from `render` (tests give their own).
async fn serve_with(
    l: MetricsListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    stop: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(l.listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics endpoint: {e}");
            return;
        }
    };
    accept_loop(listener, "metrics endpoint", MAX_CLIENTS, stop, |stream| {
        let render = render.clone();
        async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = route(&req, &*render);
                async move { Ok::<_, Infallible>(answer) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(CLIENT_TIMEOUT)
                .keep_alive(false)
                .max_buf_size(MAX_REQUEST)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CLIENT_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("metrics client: {e}"),
                Err(_) => tracing::debug!("metrics client: not done within {CLIENT_TIMEOUT:?}"),
            }
        }
    })
    .await;
}

fn text(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The answer to one request.
fn route<B>(req: &Request<B>, render: &dyn Fn() -> String) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    let path = req.uri().path();
    if path != "/metrics" {
        return text(
            StatusCode::NOT_FOUND,
            PLAIN,
            format!("no such path {path:?}; the metrics are at /metrics\n"),
        );
    }
    match *req.method() {
        // hyper leaves the body out of a HEAD answer, keeping its length.
        Method::GET | Method::HEAD => text(StatusCode::OK, METRICS_TYPE, render()),
        ref m => {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                PLAIN,
                format!("method {m} not allowed; use GET\n"),
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
    }
}

/// A counter name from the status document turned into a metric name
/// part: characters outside `[a-zA-Z0-9_]` become `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The counters of `Status::counters` with their metric names (without
/// `_total`, which the encoder adds) and help; a counter not listed here
/// is exported as `espgate_NAME_total`.
const COUNTERS: [(&str, &str, &str); 21] = [
    (
        "tun_rx",
        "espgate_tun_rx_packets",
        "Packets read from the TUN device.",
    ),
    (
        "tun_tx",
        "espgate_tun_tx_packets",
        "Packets written to the TUN device.",
    ),
    (
        "net_rx",
        "espgate_net_rx_packets",
        "Outer packets received (ESP-in-UDP datagrams, raw ESP/AH).",
    ),
    ("net_tx", "espgate_net_tx_packets", "Outer packets sent."),
    (
        "keepalives",
        "espgate_nat_keepalives",
        "RFC 3948 NAT keepalives received and ignored.",
    ),
    (
        "ike",
        "espgate_ike_packets",
        "IKE messages received behind the non-ESP marker on the NAT-T port (handed to the IKE \
         engine, or ignored when no connection uses IKE).",
    ),
    (
        "dummies",
        "espgate_dummy_packets",
        "ESP dummy packets (next header 59) received and discarded.",
    ),
    (
        "not_unicast",
        "espgate_not_unicast_packets",
        "Multicast, broadcast and link-local packets read from the TUN, which no SA carries.",
    ),
    (
        "mss_clamped",
        "espgate_mss_clamped",
        "TCP SYN and SYN-ACK segments whose MSS option was lowered (mss_clamp).",
    ),
    (
        "icmp_too_big",
        "espgate_icmp_too_big_sent",
        "ICMP fragmentation-needed / packet-too-big messages written to the TUN for clear \
         packets above the tunnel's learnt path MTU (RFC 4301 section 8.2.1).",
    ),
    (
        "keepalives_sent",
        "espgate_nat_keepalives_sent",
        "RFC 3948 NAT keepalives sent (nat_keepalive).",
    ),
    (
        "gso_sends",
        "espgate_udp_gso_sends",
        "UDP_SEGMENT sends, each carrying several ESP-in-UDP datagrams.",
    ),
    (
        "raw_batch_sends",
        "espgate_raw_batch_sends",
        "sendmmsg calls that sent several raw ESP/AH packets (raw IP has no GSO).",
    ),
    (
        "udp_batch_sends",
        "espgate_udp_batch_sends",
        "sendmmsg calls that sent several ESP-in-UDP messages (runs to several peers or TOS values).",
    ),
    (
        "gro_reads",
        "espgate_udp_gro_reads",
        "UDP reads that returned several datagrams coalesced by UDP_GRO.",
    ),
    (
        "tso_reads",
        "espgate_tun_tso_reads",
        "TUN reads that returned a TCP/UDP super-segment, cut before encryption.",
    ),
    (
        "tun_gso_writes",
        "espgate_tun_gso_writes",
        "TUN writes of a super-segment coalesced from several decrypted TCP segments.",
    ),
    (
        "hold_flushes",
        "espgate_hold_flushes",
        "Batches sent or super-segments written before their round ended, because their first packet had waited the hold time (e.g. a slow cipher).",
    ),
    (
        "udp_socket_drops",
        "espgate_udp_socket_drops",
        "Datagrams the kernel dropped at the ESP-in-UDP sockets: refused by the SPI filter \
         during an unknown-SPI flood, or arriving to a full receive buffer.",
    ),
    (
        "spi_filter_engaged",
        "espgate_spi_filter_engagements",
        "Times a flood of unknown SPIs engaged the kernel-side SPI filter.",
    ),
    (
        "hot_path_allocs",
        "espgate_hot_path_allocations",
        "Heap allocations made by the data plane's packet handlers (0 in the steady state).",
    ),
];

type Labels = Vec<(&'static str, String)>;

/// One family's samples: its labels and value.
enum Samples {
    Counter(Vec<(Labels, u64)>),
    Seconds(Vec<(Labels, f64)>),
    Gauge(Vec<(Labels, i64)>),
}

/// Writes one family (nothing at all for a family without samples).
fn family(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: Samples,
) -> fmt::Result {
    let (kind, empty) = match &samples {
        Samples::Counter(s) => (MetricType::Counter, s.is_empty()),
        Samples::Seconds(s) => (MetricType::Counter, s.is_empty()),
        Samples::Gauge(s) => (MetricType::Gauge, s.is_empty()),
    };
    if empty {
        return Ok(());
    }
    let mut f = enc.encode_descriptor(name, help, None, kind)?;
    // A family without labels has one sample, written as `name value`.
    match samples {
        Samples::Counter(s) => match s.as_slice() {
            [(l, v)] if l.is_empty() => ConstCounter::new(*v).encode(f)?,
            _ => {
                for (labels, v) in s {
                    ConstCounter::new(v).encode(f.encode_family(&labels)?)?;
                }
            }
        },
        Samples::Seconds(s) => {
            for (labels, v) in s {
                ConstCounter::new(v).encode(f.encode_family(&labels)?)?;
            }
        }
        Samples::Gauge(s) => match s.as_slice() {
            [(l, v)] if l.is_empty() => ConstGauge::new(*v).encode(f)?,
            _ => {
                for (labels, v) in s {
                    ConstGauge::new(v).encode(f.encode_family(&labels)?)?;
                }
            }
        },
    }
    Ok(())
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The labels that name one SA, plus `more`.
fn sa_labels(sa: &SaStatus, more: Option<(&'static str, &str)>) -> Labels {
    let mut l = vec![
        ("connection", sa.connection.clone()),
        ("direction", sa.direction.clone()),
        ("spi", sa.spi.clone()),
        ("proto", sa.protocol.clone()),
        ("suite", sa.suite.clone()),
    ];
    if let Some((k, v)) = more {
        l.push((k, v.to_string()));
    }
    l
}

/// The status document as a collector: encoded at each scrape.
#[derive(Debug)]
struct Doc(Status);

impl Collector for Doc {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        encode_status(&self.0, &mut enc)
    }
}

/// The exposition text of a status document.
pub fn render(s: &Status) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Doc(s.clone())));
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &registry) {
        Ok(()) => out,
        Err(e) => format!("# encoding the metrics failed: {e}\n# EOF\n"),
    }
}

fn encode_status(s: &Status, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
    use Samples::{Counter, Gauge, Seconds};
    let sas: Vec<&SaStatus> = s.connections.iter().flat_map(|c| &c.sas).collect();
    family(
        enc,
        "espgate_build_info",
        "The running espgate version; always 1.",
        Gauge(vec![(vec![("version", s.version.clone())], 1)]),
    )?;
    family(
        enc,
        "espgate_uptime_seconds",
        "Seconds since the daemon started.",
        Gauge(vec![(vec![], gauge(s.uptime_secs))]),
    )?;
    family(
        enc,
        "espgate_tun_mtu_bytes",
        "MTU of the TUN device: the longest packet every outbound bundle keeps within gateway.mtu.",
        Gauge(vec![(
            vec![("tun", s.tun.name.clone())],
            i64::from(s.tun.mtu),
        )]),
    )?;
    family(
        enc,
        "espgate_workers",
        "Data-plane threads running.",
        Gauge(vec![(vec![], gauge(s.workers as u64))]),
    )?;
    family(
        enc,
        "espgate_connections",
        "Connections configured.",
        Gauge(vec![(vec![], gauge(s.connections.len() as u64))]),
    )?;
    family(
        enc,
        "espgate_sas",
        "SAs installed.",
        Gauge(vec![(vec![], gauge(sas.len() as u64))]),
    )?;
    for (key, name, help) in COUNTERS {
        let v = s.counters.get(key).copied().unwrap_or(0);
        family(enc, name, help, Counter(vec![(vec![], v)]))?;
    }
    for (key, v) in &s.counters {
        if COUNTERS.iter().any(|(k, _, _)| k == key) {
            continue;
        }
        let name = format!("espgate_{}", sanitize(key));
        let help = format!("The {key} counter of espgate status.");
        family(enc, &name, &help, Counter(vec![(vec![], *v)]))?;
    }
    let mut reasons: Vec<String> = DropReason::ALL
        .iter()
        .map(|d| d.as_str().to_string())
        .collect();
    for k in s.drops.keys() {
        if !reasons.contains(k) {
            reasons.push(k.clone());
        }
    }
    reasons.sort();
    family(
        enc,
        "espgate_drops",
        "Packets dropped, by reason, over all SAs and both directions.",
        Counter(
            reasons
                .into_iter()
                .map(|r| {
                    let n = s.drops.get(&r).copied().unwrap_or(0);
                    (vec![("reason", r)], n)
                })
                .collect(),
        ),
    )?;
    family(
        enc,
        "espgate_sa_packets",
        "Packets processed by the SA.",
        Counter(
            sas.iter()
                .map(|sa| (sa_labels(sa, None), sa.packets))
                .collect(),
        ),
    )?;
    family(
        enc,
        "espgate_sa_bytes",
        "Payload bytes processed by the SA.",
        Counter(
            sas.iter()
                .map(|sa| (sa_labels(sa, None), sa.bytes))
                .collect(),
        ),
    )?;
    family(
        enc,
        "espgate_sa_dummy_packets",
        "ESP dummy packets received on the SA and discarded.",
        Counter(
            sas.iter()
                .map(|sa| (sa_labels(sa, None), sa.dummies))
                .collect(),
        ),
    )?;
    let mut sa_drops = Vec::new();
    for sa in &sas {
        let mut reasons: Vec<String> = DropReason::PER_SA
            .iter()
            .map(|d| d.as_str().to_string())
            .collect();
        for k in sa.drops.keys() {
            if !reasons.contains(k) {
                reasons.push(k.clone());
            }
        }
        reasons.sort();
        for r in reasons {
            let n = sa.drops.get(&r).copied().unwrap_or(0);
            sa_drops.push((sa_labels(sa, Some(("reason", &r))), n));
        }
    }
    family(
        enc,
        "espgate_sa_drops",
        "Packets the SA dropped, by reason.",
        Counter(sa_drops),
    )?;
    let seq = |pick: fn(&SaStatus) -> Option<u64>| -> Samples {
        Gauge(
            sas.iter()
                .filter_map(|sa| pick(sa).map(|n| (sa_labels(sa, None), gauge(n))))
                .collect(),
        )
    };
    family(
        enc,
        "espgate_sa_next_sequence_number",
        "Outbound SA: the next sequence number to send.",
        seq(|sa| sa.next_seq),
    )?;
    family(
        enc,
        "espgate_sa_reserved_sequence_number",
        "Outbound SA: sequence numbers below this are reserved on disk.",
        seq(|sa| sa.seq_reserved),
    )?;
    family(
        enc,
        "espgate_sa_highest_sequence_number",
        "Inbound SA: the highest sequence number authenticated.",
        seq(|sa| sa.highest_seq),
    )?;
    family(
        enc,
        "espgate_sa_lifetime_state",
        "SA lifetime state: 1 for the current state (ok, soft_expired, hard_expired), 0 for the \
         others.",
        Gauge(
            sas.iter()
                .flat_map(|sa| {
                    ["ok", "soft_expired", "hard_expired"].map(|st| {
                        (
                            sa_labels(sa, Some(("state", st))),
                            i64::from(sa.lifetime.state == st),
                        )
                    })
                })
                .collect(),
        ),
    )?;
    type Pick = fn(&Left) -> Option<u64>;
    let left: [(&str, &str, Pick); 3] = [
        (
            "espgate_sa_lifetime_remaining_seconds",
            "Seconds left before the SA's soft or hard time limit (configured limits only).",
            |l| l.secs,
        ),
        (
            "espgate_sa_lifetime_remaining_bytes",
            "Bytes left before the SA's soft or hard byte limit (configured limits only).",
            |l| l.bytes,
        ),
        (
            "espgate_sa_lifetime_remaining_packets",
            "Packets left before the SA's soft or hard packet limit (configured limits only).",
            |l| l.packets,
        ),
    ];
    for (name, help, pick) in left {
        let samples = sas
            .iter()
            .flat_map(|sa| {
                [
                    ("soft", &sa.lifetime.soft_left),
                    ("hard", &sa.lifetime.hard_left),
                ]
                .into_iter()
                .filter_map(|(limit, l)| {
                    pick(l).map(|n| (sa_labels(sa, Some(("limit", limit))), gauge(n)))
                })
                .collect::<Vec<_>>()
            })
            .collect();
        family(enc, name, help, Gauge(samples))?;
    }
    if let Some(c) = &s.costs {
        let mut seconds = Vec::new();
        let mut packets = Vec::new();
        for d in Dir::ALL {
            for st in d.stages() {
                let sc = c.dir(d).stage(*st);
                let labels: Labels = vec![
                    ("direction", d.as_str().to_string()),
                    ("stage", st.as_str().to_string()),
                ];
                seconds.push((labels.clone(), sc.total_ns as f64 / 1e9));
                packets.push((labels, sc.packets));
            }
        }
        family(
            enc,
            "espgate_stage_seconds",
            "Time spent in each stage of ESP processing, by direction (cost accounting; AEAD \
             suites count their integrity as cipher).",
            Seconds(seconds),
        )?;
        family(
            enc,
            "espgate_stage_packets",
            "Packets that went through each stage of ESP processing, by direction (cost \
             accounting).",
            Counter(packets),
        )?;
    }
    if let Some(ike) = &s.ike {
        family(
            enc,
            "espgate_ike_sas",
            "IKE SAs, by connection and state.",
            Gauge(
                ike.sas
                    .iter()
                    .map(|sa| {
                        (
                            vec![
                                ("connection", sa.connection.clone()),
                                ("state", sa.state.clone()),
                            ],
                            1,
                        )
                    })
                    .collect(),
            ),
        )?;
        family(
            enc,
            "espgate_ike_events",
            "IKEv2 engine counters: messages, exchanges, rekeys, retransmissions, dead peers and \
             every reason a message was dropped.",
            Counter(
                ike.counters
                    .iter()
                    .map(|(k, v)| (vec![("event", k.clone())], *v))
                    .collect(),
            ),
        )?;
        family(
            enc,
            "espgate_ike_operation_seconds",
            "Time spent in each IKEv2 operation (DH, signatures, key derivation, encryption, \
             encoding) over all IKE SAs.",
            Seconds(
                ike.costs
                    .iter()
                    .map(|c| (vec![("op", c.op.clone())], c.micros / 1e6))
                    .collect(),
            ),
        )?;
        family(
            enc,
            "espgate_ike_operations",
            "IKEv2 operations done, by kind.",
            Counter(
                ike.costs
                    .iter()
                    .map(|c| (vec![("op", c.op.clone())], c.count))
                    .collect(),
            ),
        )?;
    }
    if let Some(c) = &s.cluster {
        encode_cluster(c, enc)?;
    }
    Ok(())
}

/// Seed 003's cluster node: its plan, state and per-SA share.
fn encode_cluster(
    c: &espgate_api::cluster::ClusterStatus,
    enc: &mut DescriptorEncoder<'_>,
) -> fmt::Result {
    use Samples::{Counter, Gauge};
    let node = || vec![("node", c.node.to_string())];
    family(
        enc,
        "espgate_cluster_plan_epoch",
        "Epoch of the cluster's dispatch plan in force on this node (0: none yet).",
        Gauge(vec![(
            node(),
            gauge(c.plan.as_ref().map_or(0, |p| p.epoch)),
        )]),
    )?;
    family(
        enc,
        "espgate_cluster_plan_members",
        "Nodes in the dispatch plan in force.",
        Gauge(vec![(
            node(),
            gauge(c.plan.as_ref().map_or(0, |p| p.members.len() as u64)),
        )]),
    )?;
    family(
        enc,
        "espgate_cluster_plan_age_seconds",
        "Seconds since the cluster agent last confirmed the plan (past the hold, the node stops \
         processing).",
        Gauge(vec![(node(), gauge(c.plan_age_ms.unwrap_or(0) / 1000))]),
    )?;
    family(
        enc,
        "espgate_cluster_in_step",
        "1 when every outbound SA's sequence numbers agree with the other nodes'.",
        Gauge(vec![(node(), i64::from(c.in_step))]),
    )?;
    family(
        enc,
        "espgate_cluster_processing",
        "1 when this node holds a valid plan that names it, and is in step.",
        Gauge(vec![(node(), i64::from(c.state == "processing"))]),
    )?;
    let per_sa = |f: &dyn Fn(&espgate_api::cluster::ClusterSa) -> u64| {
        c.sas
            .iter()
            .map(|sa| {
                (
                    vec![
                        ("connection", sa.conn.clone()),
                        (
                            "direction",
                            if sa.outbound { "out" } else { "in" }.to_string(),
                        ),
                        ("spi", format!("{:#010x}", sa.spi)),
                    ],
                    f(sa),
                )
            })
            .collect::<Vec<_>>()
    };
    family(
        enc,
        "espgate_cluster_sa_processed_packets",
        "Packets of the SA this node processed (encrypted or decrypted).",
        Counter(per_sa(&|sa| sa.processed)),
    )?;
    family(
        enc,
        "espgate_cluster_sa_observed_packets",
        "Packets of the SA this node only counted: state advanced, another node processed them.",
        Counter(per_sa(&|sa| sa.observed)),
    )?;
    family(
        enc,
        "espgate_cluster_sa_resyncs",
        "Times this node moved an outbound SA's sequence number to the other nodes'.",
        Counter(per_sa(&|sa| sa.resyncs)),
    )
}

/// Parses OpenMetrics text back into `name{labels}` → value, checking the
/// grammar on the way (tests only): HELP then TYPE then the family's
/// samples, counters' samples named `FAMILY_total`, label values quoted
/// and escaped, `# EOF` last.
#[cfg(test)]
pub(crate) fn parse(text: &str) -> Result<std::collections::BTreeMap<String, f64>, String> {
    use std::collections::BTreeMap;
    let mut out = BTreeMap::new();
    let mut families: Vec<String> = Vec::new();
    let mut current: Option<(String, String)> = None;
    let mut helped: Option<String> = None;
    let mut eof = false;
    for (n, line) in text.lines().enumerate() {
        let err = |m: &str| format!("line {}: {m}: {line:?}", n + 1);
        if eof {
            return Err(err("text after # EOF"));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if families.iter().any(|f| f == name) {
                return Err(err("family repeated"));
            }
            families.push(name.to_string());
            helped = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut p = rest.split(' ');
            let (name, kind) = (p.next().unwrap_or(""), p.next().unwrap_or(""));
            if helped.as_deref() != Some(name) {
                return Err(err("TYPE without its HELP"));
            }
            if !["counter", "gauge"].contains(&kind) {
                return Err(err("bad type"));
            }
            current = Some((name.to_string(), kind.to_string()));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(err("unexpected line"));
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| err("no value"))?;
        let value: f64 = value.parse().map_err(|_| err("bad value"))?;
        if !(value.is_finite() && value >= 0.0) {
            return Err(err("bad value"));
        }
        let name = series.split('{').next().unwrap_or("");
        let Some((family, kind)) = &current else {
            return Err(err("sample outside a family"));
        };
        let want = if kind == "counter" {
            format!("{family}_total")
        } else {
            family.clone()
        };
        if name != want {
            return Err(err("sample name does not match its family"));
        }
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .filter(|l| !l.is_empty())
                .ok_or_else(|| err("bad label set"))?;
            let mut chars = inner.chars().peekable();
            loop {
                let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
                if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(err("bad label name"));
                }
                if chars.next() != Some('"') {
                    return Err(err("label value not quoted"));
                }
                loop {
                    match chars.next() {
                        Some('\\') => match chars.next() {
                            Some('\\' | '"' | 'n') => {}
                            _ => return Err(err("bad escape")),
                        },
                        Some('"') => break,
                        Some('\n') | None => return Err(err("unterminated label value")),
                        Some(_) => {}
                    }
                }
                match chars.next() {
                    Some(',') => continue,
                    None => break,
                    Some(_) => return Err(err("junk after a label value")),
                }
            }
        }
        if out.insert(series.to_string(), value).is_some() {
            return Err(err("series repeated"));
        }
    }
    if !eof {
        return Err("no # EOF at the end".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_api::status::{ConnectionStatus, LifetimeStatus, TunStatus};
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};

    fn sa(conn: &str, dir: &str, spi: &str, drops: &[(&str, u64)]) -> SaStatus {
        SaStatus {
            connection: conn.into(),
            direction: dir.into(),
            added: false,
            spi: spi.into(),
            protocol: "esp".into(),
            suite: "aes128gcm16".into(),
            mode: "tunnel".into(),
            encap: "udp".into(),
            udp_ports: Some((4500, 4500)),
            peer: None,
            esn: false,
            packets: 3,
            bytes: 252,
            dummies: 1,
            drops: drops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            next_seq: (dir == "out").then_some(4),
            seq_reserved: (dir == "out").then_some(1_048_580),
            seq_reserve_failed: 0,
            highest_seq: (dir == "in").then_some(3),
            lifetime: LifetimeStatus {
                state: "ok".into(),
                ..Default::default()
            },
        }
    }

    fn sample(conn: &str) -> Status {
        let mut inbound = sa(conn, "in", "0x00001001", &[("replay", 2)]);
        inbound.lifetime.hard_left = Left {
            bytes: Some(1000),
            packets: None,
            secs: Some(3540),
        };
        inbound.lifetime.state = "soft_expired".into();
        Status {
            version: "0.1.0".into(),
            pid: 42,
            uptime_secs: 75,
            config: "/etc/espgate/gw.toml".into(),
            tun: TunStatus {
                name: "espgate0".into(),
                mtu: 1438,
            },
            encap: "udp".into(),
            listen: Some("0.0.0.0:4500".into()),
            fwmark: None,
            workers: 1,
            per_worker: Vec::new(),
            offloads: Vec::new(),
            state_dir: "/var/lib/espgate".into(),
            connections: vec![ConnectionStatus {
                name: conn.into(),
                mode: "tunnel".into(),
                protocol: "esp".into(),
                encap: "udp".into(),
                local: "192.0.2.1".into(),
                remote: "192.0.2.2:4500".into(),
                local_ts: vec!["10.1.0.0/24".into()],
                remote_ts: vec!["10.2.0.0/24".into()],
                more_ts: Vec::new(),
                sas: vec![inbound, sa(conn, "out", "0x00001002", &[])],
            }],
            ike: None,
            drops: [("replay".to_string(), 2), ("no_policy".to_string(), 5)]
                .into_iter()
                .collect(),
            counters: [
                ("keepalives".to_string(), 7),
                ("tun_rx".to_string(), 3),
                ("new-thing".to_string(), 9),
            ]
            .into_iter()
            .collect(),
            costs: None,
            cluster: None,
        }
    }

    #[test]
    fn stage_costs_are_exported_only_while_accounting_is_on() {
        use espgate_api::costs::{ClockKind, Costs};
        use espgate_core::cost::{Probe, Stage};
        let off = render(&sample("site-b"));
        assert!(!off.contains("espgate_stage_"), "{off}");
        let mut c = Costs::with_clock(ClockKind::Monotonic);
        for _ in 0..2 {
            c.begin(Dir::Inbound);
            c.mark(Stage::Lookup);
            std::hint::black_box((0..1000u64).sum::<u64>());
            c.mark(Stage::Cipher);
        }
        let mut s = sample("site-b");
        s.costs = Some(c.report());
        let text = render(&s);
        let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let key =
            |name: &str, d: &str, st: &str| format!("{name}{{direction=\"{d}\",stage=\"{st}\"}}");
        assert_eq!(
            m[&key("espgate_stage_packets_total", "inbound", "cipher")],
            2.0
        );
        assert_eq!(
            m[&key("espgate_stage_packets_total", "inbound", "receive")],
            2.0
        );
        assert_eq!(
            m[&key("espgate_stage_packets_total", "inbound", "decap")],
            0.0
        );
        assert_eq!(
            m[&key("espgate_stage_packets_total", "outbound", "encap")],
            0.0
        );
        assert!(!m.contains_key(&key("espgate_stage_packets_total", "outbound", "decap")));
        // Seconds are floats: the cipher stage's value is its total_ns / 1e9.
        let v = m[&key("espgate_stage_seconds_total", "inbound", "cipher")];
        let ns = s
            .costs
            .as_ref()
            .unwrap()
            .inbound
            .stage(Stage::Cipher)
            .total_ns;
        assert!(ns > 0);
        assert!((v - ns as f64 / 1e9).abs() < 1e-12, "{v}");
        assert!(text.contains("# TYPE espgate_stage_seconds counter\n"));
    }

    const SA_IN: &str =
        r#"connection="site-b",direction="in",spi="0x00001001",proto="esp",suite="aes128gcm16""#;
    const SA_OUT: &str =
        r#"connection="site-b",direction="out",spi="0x00001002",proto="esp",suite="aes128gcm16""#;

    #[test]
    fn every_reason_and_counter_is_present() {
        let text = render(&sample("site-b"));
        let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for d in DropReason::ALL {
            let want = match d.as_str() {
                "replay" => 2.0,
                "no_policy" => 5.0,
                _ => 0.0,
            };
            let key = format!("espgate_drops_total{{reason=\"{}\"}}", d.as_str());
            assert_eq!(m.get(&key), Some(&want), "{key}\n{text}");
            // Per SA: the reasons SA processing counts, and only those.
            let per_sa = DropReason::PER_SA.contains(&d);
            for (labels, n) in [
                (SA_IN, if d.as_str() == "replay" { 2.0 } else { 0.0 }),
                (SA_OUT, 0.0),
            ] {
                let key = format!(
                    "espgate_sa_drops_total{{{labels},reason=\"{}\"}}",
                    d.as_str()
                );
                assert_eq!(m.get(&key), per_sa.then_some(&n), "{key}");
            }
        }
        // Counters absent from the document are 0; unknown ones get a name.
        assert_eq!(m["espgate_nat_keepalives_total"], 7.0);
        assert_eq!(m["espgate_tun_rx_packets_total"], 3.0);
        assert_eq!(m["espgate_mss_clamped_total"], 0.0);
        assert_eq!(m["espgate_new_thing_total"], 9.0);
        assert_eq!(m[&format!("espgate_sa_packets_total{{{SA_IN}}}")], 3.0);
        assert_eq!(m[&format!("espgate_sa_bytes_total{{{SA_OUT}}}")], 252.0);
        assert_eq!(
            m[&format!("espgate_sa_next_sequence_number{{{SA_OUT}}}")],
            4.0
        );
        assert_eq!(
            m[&format!("espgate_sa_highest_sequence_number{{{SA_IN}}}")],
            3.0
        );
        assert!(!m.contains_key(&format!("espgate_sa_next_sequence_number{{{SA_IN}}}")));
        // Lifetime: only the limits that are set.
        assert_eq!(
            m[&format!("espgate_sa_lifetime_remaining_seconds{{{SA_IN},limit=\"hard\"}}")],
            3540.0
        );
        assert_eq!(
            m[&format!("espgate_sa_lifetime_remaining_bytes{{{SA_IN},limit=\"hard\"}}")],
            1000.0
        );
        assert!(
            !text.contains("espgate_sa_lifetime_remaining_packets"),
            "{text}"
        );
        assert!(!m.keys().any(|k| k.contains("limit=\"soft\"")));
        assert_eq!(
            m[&format!("espgate_sa_lifetime_state{{{SA_IN},state=\"soft_expired\"}}")],
            1.0
        );
        assert_eq!(
            m[&format!("espgate_sa_lifetime_state{{{SA_IN},state=\"ok\"}}")],
            0.0
        );
        assert_eq!(m["espgate_build_info{version=\"0.1.0\"}"], 1.0);
        assert_eq!(m["espgate_tun_mtu_bytes{tun=\"espgate0\"}"], 1438.0);
        assert_eq!(m["espgate_uptime_seconds"], 75.0);
        assert!(text.contains("# HELP espgate_drops Packets dropped, by reason, over all SAs"));
        assert!(text.contains("# TYPE espgate_drops counter\n"));
        assert!(text.contains("# TYPE espgate_sa_next_sequence_number gauge\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let text = render(&sample("we\"ird\\name\nx"));
        parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(
            text.contains(
                r#"espgate_sa_packets_total{connection="we\"ird\\name\nx",direction="in""#
            ),
            "{text}"
        );
        assert_eq!(sanitize("a-b.c_9"), "a_b_c_9");
    }

    #[test]
    fn no_sas_still_lists_every_global_reason() {
        let mut s = sample("c");
        s.connections.clear();
        s.drops.clear();
        let text = render(&s);
        let m = parse(&text).unwrap();
        let n = m
            .keys()
            .filter(|k| k.starts_with("espgate_drops_total{"))
            .count();
        assert_eq!(n, DropReason::ALL.len());
        assert!(!text.contains("espgate_sa_packets_total"));
        assert_eq!(m["espgate_sas"], 0.0);
    }

    #[test]
    fn ike_metrics() {
        use espgate_api::ike::{IkeDoc, IkeOpCost, IkeSaStatus};
        let mut s = sample("to-b");
        assert!(
            !render(&s).contains("espgate_ike_sas"),
            "no IKE part without IKE"
        );
        s.ike = Some(IkeDoc {
            sas: vec![IkeSaStatus {
                connection: "to-b".into(),
                spis: "1_i 2_r".into(),
                state: "established".into(),
                initiator: true,
                local: "192.0.2.1:4500".into(),
                remote: "192.0.2.2:4500".into(),
                peer_id: Some("192.0.2.2".into()),
                algorithms: Some("aes128gcm16-prfsha256-x25519".into()),
                established_secs: Some(5),
                rekey_in_secs: None,
                nat: true,
                mobike: false,
                children: vec![],
                costs: vec![],
            }],
            counters: [("child_rekeys".to_string(), 3u64)].into_iter().collect(),
            costs: vec![IkeOpCost {
                op: "dh".into(),
                count: 4,
                micros: 250.0,
            }],
        });
        let text = render(&s);
        let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(
            m["espgate_ike_sas{connection=\"to-b\",state=\"established\"}"],
            1.0
        );
        assert_eq!(m["espgate_ike_events_total{event=\"child_rekeys\"}"], 3.0);
        assert_eq!(m["espgate_ike_operations_total{op=\"dh\"}"], 4.0);
        assert!((m["espgate_ike_operation_seconds_total{op=\"dh\"}"] - 0.00025).abs() < 1e-12);
    }

    fn exchange(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn http_answers() {
        let l = MetricsListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr();
        assert_ne!(addr.port(), 0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let body = "espgate_x_total 1\n# EOF\n";
        let server = std::thread::spawn(move || {
            rt.block_on(serve_with(l, Arc::new(|| body.to_string()), stop_rx));
        });
        // A silent client does not hold up the others.
        let _silent = TcpStream::connect(addr).unwrap();
        let ok = exchange(addr, b"GET /metrics?name[]=x HTTP/1.1\r\nHost: x\r\n\r\n");
        let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let nf = exchange(addr, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
        let post = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        );
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend_from_slice(&[b'a'; MAX_REQUEST + 10]);
        big.extend_from_slice(b"\r\n\r\n");
        let big = exchange(addr, &big);
        let cut = {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metr").unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let mut out = String::new();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.read_to_string(&mut out);
            out
        };
        let _ = stop_tx.send(true);
        server.join().unwrap();
        let lower = |s: &str| s.to_ascii_lowercase();
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            lower(&ok).contains(&format!("content-type: {METRICS_TYPE}\r\n")),
            "{ok}"
        );
        assert!(lower(&ok).contains("connection: close\r\n"), "{ok}");
        assert!(
            lower(&ok).contains(&format!("content-length: {}\r\n", body.len())),
            "{ok}"
        );
        assert!(ok.ends_with(&format!("\r\n\r\n{body}")), "{ok}");
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(
            lower(&head).contains(&format!("content-length: {}\r\n", body.len())),
            "{head}"
        );
        assert!(
            nf.starts_with("HTTP/1.1 404 Not Found\r\n") && nf.contains("/metrics"),
            "{nf}"
        );
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );
        assert!(lower(&post).contains("allow: get, head\r\n"), "{post}");
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
        // A request cut short gets no answer but a close (or a 400).
        assert!(cut.is_empty() || cut.starts_with("HTTP/1.1 400 "), "{cut}");
    }
}
