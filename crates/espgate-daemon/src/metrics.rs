//! The Prometheus metrics endpoint (`gateway.metrics = "ADDR:PORT"`):
//! `GET /metrics` over HTTP/1.x answers with the text exposition format,
//! version 0.0.4, built from the same [`Status`] document `espgate status
//! --json` returns.
//!
//! The server is a non-blocking TCP listener driven by the data-plane
//! loop's `poll(2)`, like the control socket: a request may be at most
//! [`MAX_REQUEST`] bytes of headers, a client has [`CLIENT_TIMEOUT`] to send
//! it and read the answer, at most [`MAX_CLIENTS`] are served at once, and
//! every answer closes the connection (`Connection: close`). Nothing in it
//! blocks: a slow reader only keeps its own buffered answer. `GET` and
//! `HEAD` of `/metrics` (a query string is ignored) get 200; another
//! method on `/metrics` gets 405, any other path 404, a malformed request
//! 400, an oversized one 431.
//!
//! Metric names follow the Prometheus conventions: `espgate_` prefix,
//! counters end in `_total`, units in the name (`_bytes`, `_seconds`).
//! Every drop reason ([`DropReason::ALL`] globally, [`DropReason::PER_SA`]
//! per SA) is always present, at 0 if nothing was
//! dropped for it, so that `rate()` and `increase()` work from the first
//! scrape.
//!
//! While per-stage cost accounting is on, `espgate_stage_seconds_total` and
//! `espgate_stage_packets_total` (labels `direction`, `stage`) export the
//! status document's `costs`; they are absent while it is off and restart
//! from 0 after `espgate costs reset` (a counter reset to Prometheus).

use espgate_api::costs::Dir;
use espgate_api::status::{SaStatus, Status};
use espgate_core::DropReason;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Longest request (request line and headers) accepted.
pub const MAX_REQUEST: usize = 8192;
/// Clients served at once; more wait in the listen backlog.
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take from connect to the end of the answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes read and discarded after the answer (a request body, pipelined
/// requests) before the connection is closed, so that the client is not
/// sent a reset before it reads the answer.
const MAX_DRAIN: usize = 64 * 1024;
/// `Content-Type` of the metrics.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the request headers.
    Reading,
    /// Writing the answer.
    Writing,
    /// Answer written and the write side shut down; discarding input
    /// until the client closes.
    Draining,
}

struct Client {
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    deadline: Instant,
    phase: Phase,
    drained: usize,
}

/// The listening socket and its clients.
pub struct MetricsServer {
    listener: TcpListener,
    local: SocketAddr,
    clients: Vec<Client>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("local", &self.local)
            .field("clients", &self.clients.len())
            .finish()
    }
}

/// What a complete request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (`head`: `HEAD /metrics`, headers only).
    Metrics {
        /// A `HEAD` request.
        head: bool,
    },
    /// An error answer: status code and a one-line explanation.
    Error(u16, String),
}

/// The end of the header block (`\r\n\r\n`, or `\n\n` from lenient
/// clients), as the index just past it.
fn header_end(input: &[u8]) -> Option<usize> {
    let crlf = input
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4);
    let lf = input.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Routes a complete request head (request line and headers).
pub fn route(head: &[u8]) -> Route {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = head[..line_end].trim_ascii();
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::Error(400, "the request line is not text".into());
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::Error(
            400,
            "expected a request line like \"GET /metrics HTTP/1.1\"".into(),
        );
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return Route::Error(400, format!("unsupported request {line:?}: HTTP/1.x only"));
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if path != "/metrics" {
        return Route::Error(
            404,
            format!("no such path {path:?}; the metrics are at /metrics"),
        );
    }
    match method {
        "GET" => Route::Metrics { head: false },
        "HEAD" => Route::Metrics { head: true },
        _ => Route::Error(405, format!("method {method} not allowed; use GET")),
    }
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    }
}

/// A complete HTTP/1.1 answer that closes the connection.
fn response(code: u16, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        reason_phrase(code),
        body.len()
    );
    if code == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

fn error_response(code: u16, msg: &str) -> Vec<u8> {
    response(
        code,
        "text/plain; charset=utf-8",
        &format!("{msg}\n"),
        false,
    )
}

impl MetricsServer {
    /// Listens on `addr` (non-blocking; `SO_REUSEADDR`, as std sets it).
    pub fn bind(addr: SocketAddr) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok(MetricsServer {
            listener,
            local,
            clients: Vec::new(),
        })
    }

    /// The address listened on (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The descriptors to poll: the listener first (not polled while
    /// [`MAX_CLIENTS`] are being served), then one per client.
    pub fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        let room = self.clients.len() < MAX_CLIENTS;
        out.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: if room { libc::POLLIN } else { 0 },
            revents: 0,
        });
        for c in &self.clients {
            out.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: match c.phase {
                    Phase::Reading | Phase::Draining => libc::POLLIN,
                    Phase::Writing => libc::POLLOUT,
                },
                revents: 0,
            });
        }
    }

    /// Does the work `poll` found (`fds` as filled by [`Self::poll_fds`],
    /// with `revents`; empty to only expire late clients). `render` is
    /// called for each `GET /metrics` and returns the exposition text.
    pub fn service(&mut self, fds: &[libc::pollfd], mut render: impl FnMut() -> String) {
        let now = Instant::now();
        if fds.first().is_some_and(|p| p.revents & libc::POLLIN != 0) {
            while self.clients.len() < MAX_CLIENTS {
                match self.listener.accept() {
                    Ok((stream, _)) => {
                        if stream.set_nonblocking(true).is_ok() {
                            self.clients.push(Client {
                                stream,
                                input: Vec::new(),
                                output: Vec::new(),
                                deadline: now + CLIENT_TIMEOUT,
                                phase: Phase::Reading,
                                drained: 0,
                            });
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::debug!("metrics endpoint accept: {e}");
                        break;
                    }
                }
            }
        }
        // Client i was polled as fds[1 + i]; clients accepted just now
        // come last and were not polled (they are read when poll says so).
        let mut i = 0;
        self.clients.retain_mut(|c| {
            let revents = fds
                .get(1 + i)
                .filter(|p| p.fd == c.stream.as_raw_fd())
                .map_or(0, |p| p.revents);
            i += 1;
            if now >= c.deadline {
                return false;
            }
            let ready = revents & (libc::POLLIN | libc::POLLOUT | libc::POLLHUP | libc::POLLERR);
            if ready == 0 {
                return true;
            }
            if c.phase == Phase::Reading && !c.read_request(&mut render) {
                return false;
            }
            if c.phase == Phase::Writing && !c.write_answer() {
                return false;
            }
            if c.phase == Phase::Draining {
                return c.drain();
            }
            true
        });
    }
}

impl Client {
    /// Reads what is there; once the headers are complete, queues the
    /// answer. False: drop the client.
    fn read_request(&mut self, render: &mut impl FnMut() -> String) -> bool {
        let mut chunk = [0u8; 2048];
        let mut eof = false;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
            if self.input.len() > MAX_REQUEST {
                break;
            }
        }
        let answer = match header_end(&self.input) {
            Some(end) if end <= MAX_REQUEST => match route(&self.input[..end]) {
                Route::Metrics { head } => response(200, CONTENT_TYPE, &render(), head),
                Route::Error(code, msg) => error_response(code, &msg),
            },
            _ if self.input.len() > MAX_REQUEST => error_response(
                431,
                &format!("request headers longer than {MAX_REQUEST} bytes"),
            ),
            // The client closed before finishing its request.
            _ if eof && self.input.trim_ascii().is_empty() => return false,
            _ if eof => error_response(400, "incomplete request"),
            _ => return true,
        };
        self.output = answer;
        self.input = Vec::new();
        self.phase = Phase::Writing;
        true
    }

    /// Writes what the socket takes; once all is written, shuts down the
    /// write side. False: drop the client.
    fn write_answer(&mut self) -> bool {
        while !self.output.is_empty() {
            match self.stream.write(&self.output) {
                Ok(0) => return false,
                Ok(n) => drop(self.output.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        if self.stream.shutdown(Shutdown::Write).is_err() {
            return false;
        }
        self.output = Vec::new();
        self.phase = Phase::Draining;
        true
    }

    /// Discards input until the client closes. False: done, drop it.
    fn drain(&mut self) -> bool {
        let mut chunk = [0u8; 2048];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    self.drained += n;
                    if self.drained > MAX_DRAIN {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }
}

/// A label value, escaped for the text format: `\` → `\\`, `"` → `\"`,
/// newline → `\n`.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A `# HELP` text, escaped: `\` → `\\`, newline → `\n`.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
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

/// The exposition text being written: one family at a time.
struct Text {
    out: String,
}

impl Text {
    /// `# HELP` and `# TYPE`, then the samples (name, labels, value);
    /// nothing at all for a family without samples.
    fn family<V: std::fmt::Display>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, V)>,
    ) {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return;
        }
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            self.out.push_str(name);
            if !labels.is_empty() {
                self.out.push('{');
                for (i, (k, val)) in labels.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    let _ = write!(self.out, "{k}=\"{}\"", escape_label(val));
                }
                self.out.push('}');
            }
            let _ = writeln!(self.out, " {v}");
        }
    }
}

/// The labels that name one SA.
fn sa_labels(sa: &SaStatus) -> Vec<(&'static str, String)> {
    vec![
        ("connection", sa.connection.clone()),
        ("direction", sa.direction.clone()),
        ("spi", sa.spi.clone()),
        ("proto", sa.protocol.clone()),
        ("suite", sa.suite.clone()),
    ]
}

fn with(
    mut labels: Vec<(&'static str, String)>,
    k: &'static str,
    v: &str,
) -> Vec<(&'static str, String)> {
    labels.push((k, v.to_string()));
    labels
}

/// The counters of `Status::counters` with their metric names and help;
/// a counter not listed here is exported as `espgate_NAME_total`.
const COUNTERS: [(&str, &str, &str); 15] = [
    (
        "tun_rx",
        "espgate_tun_rx_packets_total",
        "Packets read from the TUN device.",
    ),
    (
        "tun_tx",
        "espgate_tun_tx_packets_total",
        "Packets written to the TUN device.",
    ),
    (
        "net_rx",
        "espgate_net_rx_packets_total",
        "Outer packets received (ESP-in-UDP datagrams, raw ESP/AH).",
    ),
    (
        "net_tx",
        "espgate_net_tx_packets_total",
        "Outer packets sent.",
    ),
    (
        "keepalives",
        "espgate_nat_keepalives_total",
        "RFC 3948 NAT keepalives received and ignored.",
    ),
    (
        "ike",
        "espgate_ike_packets_total",
        "IKE messages received behind the non-ESP marker on the NAT-T port (handed to the IKE \
         engine, or ignored when no connection uses IKE).",
    ),
    (
        "dummies",
        "espgate_dummy_packets_total",
        "ESP dummy packets (next header 59) received and discarded.",
    ),
    (
        "not_unicast",
        "espgate_not_unicast_packets_total",
        "Multicast, broadcast and link-local packets read from the TUN, which no SA carries.",
    ),
    (
        "mss_clamped",
        "espgate_mss_clamped_total",
        "TCP SYN and SYN-ACK segments whose MSS option was lowered (mss_clamp).",
    ),
    (
        "keepalives_sent",
        "espgate_nat_keepalives_sent_total",
        "RFC 3948 NAT keepalives sent (nat_keepalive).",
    ),
    (
        "gso_sends",
        "espgate_udp_gso_sends_total",
        "UDP_SEGMENT sends, each carrying several ESP-in-UDP datagrams.",
    ),
    (
        "gro_reads",
        "espgate_udp_gro_reads_total",
        "UDP reads that returned several datagrams coalesced by UDP_GRO.",
    ),
    (
        "tso_reads",
        "espgate_tun_tso_reads_total",
        "TUN reads that returned a TCP/UDP super-segment, cut before encryption.",
    ),
    (
        "tun_gso_writes",
        "espgate_tun_gso_writes_total",
        "TUN writes of a super-segment coalesced from several decrypted TCP segments.",
    ),
    (
        "hot_path_allocs",
        "espgate_hot_path_allocations_total",
        "Heap allocations made by the data plane's packet handlers (0 in the steady state).",
    ),
];

/// Every drop reason: the core's and the daemon's, plus any other the
/// document holds.
fn all_reasons<'a>(extra: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut v: Vec<String> = DropReason::ALL
        .iter()
        .map(|d| d.as_str().to_string())
        .collect();
    for k in extra {
        if !v.contains(k) {
            v.push(k.clone());
        }
    }
    v.sort();
    v
}

/// The exposition text (format 0.0.4) of a status document.
pub fn render(s: &Status) -> String {
    let mut t = Text { out: String::new() };
    let sas: Vec<&SaStatus> = s.connections.iter().flat_map(|c| &c.sas).collect();

    t.family(
        "espgate_build_info",
        "gauge",
        "The running espgate version; always 1.",
        [(vec![("version", s.version.clone())], 1)],
    );
    t.family(
        "espgate_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
        [(vec![], s.uptime_secs)],
    );
    t.family(
        "espgate_tun_mtu_bytes",
        "gauge",
        "MTU of the TUN device: gateway.mtu minus the largest SA overhead.",
        [(vec![("tun", s.tun.name.clone())], u64::from(s.tun.mtu))],
    );
    t.family(
        "espgate_workers",
        "gauge",
        "Data-plane threads running.",
        [(vec![], s.workers as u64)],
    );
    t.family(
        "espgate_connections",
        "gauge",
        "Connections configured.",
        [(vec![], s.connections.len() as u64)],
    );
    t.family(
        "espgate_sas",
        "gauge",
        "SAs installed.",
        [(vec![], sas.len() as u64)],
    );

    for (key, name, help) in COUNTERS {
        t.family(
            name,
            "counter",
            help,
            [(vec![], s.counters.get(key).copied().unwrap_or(0))],
        );
    }
    for (key, v) in &s.counters {
        if COUNTERS.iter().any(|(k, _, _)| k == key) {
            continue;
        }
        let name = format!("espgate_{}_total", sanitize(key));
        t.family(
            &name,
            "counter",
            &format!("The {key} counter of espgate status."),
            [(vec![], *v)],
        );
    }

    t.family(
        "espgate_drops_total",
        "counter",
        "Packets dropped, by reason, over all SAs and both directions (the core's reasons \
         and the daemon's own).",
        all_reasons(s.drops.keys())
            .into_iter()
            .map(|r| {
                let n = s.drops.get(&r).copied().unwrap_or(0);
                (vec![("reason", r)], n)
            })
            .collect::<Vec<_>>(),
    );

    t.family(
        "espgate_sa_packets_total",
        "counter",
        "Packets processed by the SA.",
        sas.iter()
            .map(|sa| (sa_labels(sa), sa.packets))
            .collect::<Vec<_>>(),
    );
    t.family(
        "espgate_sa_bytes_total",
        "counter",
        "Payload bytes processed by the SA.",
        sas.iter()
            .map(|sa| (sa_labels(sa), sa.bytes))
            .collect::<Vec<_>>(),
    );
    t.family(
        "espgate_sa_dummy_packets_total",
        "counter",
        "ESP dummy packets received on the SA and discarded.",
        sas.iter()
            .map(|sa| (sa_labels(sa), sa.dummies))
            .collect::<Vec<_>>(),
    );
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
            sa_drops.push((with(sa_labels(sa), "reason", &r), n));
        }
    }
    t.family(
        "espgate_sa_drops_total",
        "counter",
        "Packets the SA dropped, by reason.",
        sa_drops,
    );
    t.family(
        "espgate_sa_next_sequence_number",
        "gauge",
        "Outbound SA: the next sequence number to send.",
        sas.iter()
            .filter_map(|sa| sa.next_seq.map(|n| (sa_labels(sa), n)))
            .collect::<Vec<_>>(),
    );
    t.family(
        "espgate_sa_reserved_sequence_number",
        "gauge",
        "Outbound SA: sequence numbers below this are reserved on disk.",
        sas.iter()
            .filter_map(|sa| sa.seq_reserved.map(|n| (sa_labels(sa), n)))
            .collect::<Vec<_>>(),
    );
    t.family(
        "espgate_sa_highest_sequence_number",
        "gauge",
        "Inbound SA: the highest sequence number authenticated.",
        sas.iter()
            .filter_map(|sa| sa.highest_seq.map(|n| (sa_labels(sa), n)))
            .collect::<Vec<_>>(),
    );
    t.family(
        "espgate_sa_lifetime_state",
        "gauge",
        "SA lifetime state: 1 for the current state (ok, soft_expired, hard_expired), 0 \
         for the others.",
        sas.iter()
            .flat_map(|sa| {
                ["ok", "soft_expired", "hard_expired"].map(|st| {
                    (
                        with(sa_labels(sa), "state", st),
                        u64::from(sa.lifetime.state == st),
                    )
                })
            })
            .collect::<Vec<_>>(),
    );
    type Pick = fn(&espgate_api::status::Left) -> Option<u64>;
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
        let samples: Vec<_> = sas
            .iter()
            .flat_map(|sa| {
                [
                    ("soft", &sa.lifetime.soft_left),
                    ("hard", &sa.lifetime.hard_left),
                ]
                .into_iter()
                .filter_map(|(limit, l)| pick(l).map(|n| (with(sa_labels(sa), "limit", limit), n)))
                .collect::<Vec<_>>()
            })
            .collect();
        t.family(name, "gauge", help, samples);
    }
    if let Some(c) = &s.costs {
        let mut seconds = Vec::new();
        let mut packets = Vec::new();
        for d in Dir::ALL {
            for st in d.stages() {
                let sc = c.dir(d).stage(*st);
                let labels = vec![
                    ("direction", d.as_str().to_string()),
                    ("stage", st.as_str().to_string()),
                ];
                seconds.push((labels.clone(), sc.total_ns as f64 / 1e9));
                packets.push((labels, sc.packets));
            }
        }
        t.family(
            "espgate_stage_seconds_total",
            "counter",
            "Time spent in each stage of ESP processing, by direction (cost accounting; \
             AEAD suites count their integrity as cipher).",
            seconds,
        );
        t.family(
            "espgate_stage_packets_total",
            "counter",
            "Packets that went through each stage of ESP processing, by direction (cost \
             accounting).",
            packets,
        );
    }
    if let Some(ike) = &s.ike {
        t.family(
            "espgate_ike_sas",
            "gauge",
            "IKE SAs, by connection and state.",
            ike.sas.iter().map(|sa| {
                (
                    vec![
                        ("connection", sa.connection.clone()),
                        ("state", sa.state.clone()),
                    ],
                    1u64,
                )
            }),
        );
        t.family(
            "espgate_ike_events_total",
            "counter",
            "IKEv2 engine counters: messages, exchanges, rekeys, retransmissions, dead peers \
             and every reason a message was dropped.",
            ike.counters
                .iter()
                .map(|(k, v)| (vec![("event", k.clone())], *v)),
        );
        t.family(
            "espgate_ike_operation_seconds_total",
            "counter",
            "Time spent in each IKEv2 operation (DH, signatures, key derivation, encryption, \
             encoding) over all IKE SAs.",
            ike.costs
                .iter()
                .map(|c| (vec![("op", c.op.clone())], c.micros / 1e6)),
        );
        t.family(
            "espgate_ike_operations_total",
            "counter",
            "IKEv2 operations done, by kind.",
            ike.costs
                .iter()
                .map(|c| (vec![("op", c.op.clone())], c.count)),
        );
    }
    t.out
}

/// Parses exposition text back into `name{labels}` → value, checking the
/// grammar on the way (tests only).
#[cfg(test)]
pub(crate) fn parse(text: &str) -> Result<std::collections::BTreeMap<String, u64>, String> {
    use std::collections::BTreeMap;
    let mut out = BTreeMap::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut seen_families = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let err = |m: &str| format!("line {}: {m}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if seen_families.contains(&name.to_string()) {
                return Err(err("family repeated"));
            }
            seen_families.push(name.to_string());
            current = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut p = rest.split(' ');
            let (name, kind) = (p.next().unwrap_or(""), p.next().unwrap_or(""));
            if current.as_deref() != Some(name) {
                return Err(err("TYPE without its HELP"));
            }
            if !["counter", "gauge"].contains(&kind) {
                return Err(err("bad type"));
            }
            typed.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(err("unexpected line"));
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| err("no value"))?;
        // Integers are kept as they are; other values (seconds) must be
        // finite non-negative floats and are truncated in the map.
        let value: u64 = match value.parse::<u64>() {
            Ok(v) => v,
            Err(_) => {
                let f: f64 = value.parse().map_err(|_| err("bad value"))?;
                if !(f.is_finite() && f >= 0.0) {
                    return Err(err("bad value"));
                }
                f as u64
            }
        };
        let name = series.split('{').next().unwrap_or("");
        if Some(name) != current.as_deref() || !typed.contains_key(name) {
            return Err(err("sample outside its family"));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(err("bad metric name"));
        }
        if typed[name] == "counter" && !name.ends_with("_total") {
            return Err(err("counter without _total"));
        }
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .ok_or_else(|| err("bad label set"))?;
            // label="value" pairs, values escaped.
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_api::status::{ConnectionStatus, Left, LifetimeStatus, TunStatus};

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
            esn: false,
            packets: 3,
            bytes: 252,
            dummies: 1,
            drops: drops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            next_seq: (dir == "out").then_some(4),
            seq_reserved: (dir == "out").then_some(1_048_580),
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
            2
        );
        assert_eq!(
            m[&key("espgate_stage_packets_total", "inbound", "receive")],
            2
        );
        assert_eq!(
            m[&key("espgate_stage_packets_total", "inbound", "decap")],
            0
        );
        assert_eq!(
            m[&key("espgate_stage_packets_total", "outbound", "encap")],
            0
        );
        assert!(!m.contains_key(&key("espgate_stage_packets_total", "outbound", "decap")));
        // Seconds are floats: the cipher stage's value is its total_ns / 1e9.
        let line = text
            .lines()
            .find(|l| l.starts_with(&key("espgate_stage_seconds_total", "inbound", "cipher")))
            .unwrap();
        let v: f64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
        let ns = s
            .costs
            .as_ref()
            .unwrap()
            .inbound
            .stage(Stage::Cipher)
            .total_ns;
        assert!(ns > 0);
        assert!((v - ns as f64 / 1e9).abs() < 1e-12, "{line}");
        assert!(text.contains("# TYPE espgate_stage_seconds_total counter\n"));
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
                "replay" => 2,
                "no_policy" => 5,
                _ => 0,
            };
            let key = format!("espgate_drops_total{{reason=\"{}\"}}", d.as_str());
            assert_eq!(m.get(&key), Some(&want), "{key}\n{text}");
            // Per SA: the reasons SA processing counts, and only those.
            let per_sa = DropReason::PER_SA.contains(&d);
            for (labels, n) in [
                (SA_IN, if d.as_str() == "replay" { 2 } else { 0 }),
                (SA_OUT, 0),
            ] {
                let key = format!(
                    "espgate_sa_drops_total{{{labels},reason=\"{}\"}}",
                    d.as_str()
                );
                assert_eq!(m.get(&key), per_sa.then_some(&n), "{key}");
            }
        }
        // Counters absent from the document are 0; unknown ones get a name.
        assert_eq!(m["espgate_nat_keepalives_total"], 7);
        assert_eq!(m["espgate_tun_rx_packets_total"], 3);
        assert_eq!(m["espgate_mss_clamped_total"], 0);
        assert_eq!(m["espgate_new_thing_total"], 9);
        assert_eq!(m[&format!("espgate_sa_packets_total{{{SA_IN}}}")], 3);
        assert_eq!(m[&format!("espgate_sa_bytes_total{{{SA_OUT}}}")], 252);
        assert_eq!(
            m[&format!("espgate_sa_next_sequence_number{{{SA_OUT}}}")],
            4
        );
        assert_eq!(
            m[&format!("espgate_sa_highest_sequence_number{{{SA_IN}}}")],
            3
        );
        assert!(!m.contains_key(&format!("espgate_sa_next_sequence_number{{{SA_IN}}}")));
        // Lifetime: only the limits that are set.
        assert_eq!(
            m[&format!("espgate_sa_lifetime_remaining_seconds{{{SA_IN},limit=\"hard\"}}")],
            3540
        );
        assert_eq!(
            m[&format!("espgate_sa_lifetime_remaining_bytes{{{SA_IN},limit=\"hard\"}}")],
            1000
        );
        assert!(
            !text.contains("espgate_sa_lifetime_remaining_packets"),
            "{text}"
        );
        assert!(!m.keys().any(|k| k.contains("limit=\"soft\"")));
        assert_eq!(
            m[&format!("espgate_sa_lifetime_state{{{SA_IN},state=\"soft_expired\"}}")],
            1
        );
        assert_eq!(
            m[&format!("espgate_sa_lifetime_state{{{SA_IN},state=\"ok\"}}")],
            0
        );
        assert_eq!(m["espgate_build_info{version=\"0.1.0\"}"], 1);
        assert_eq!(m["espgate_tun_mtu_bytes{tun=\"espgate0\"}"], 1438);
        assert!(
            text.contains("# HELP espgate_drops_total Packets dropped, by reason, over all SAs")
        );
        assert!(text.contains("# TYPE espgate_drops_total counter\n"));
        assert!(text.contains("# TYPE espgate_sa_next_sequence_number gauge\n"));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), r"x\ny");
        assert_eq!(escape_help("a\\b\nc"), r"a\\b\nc");
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
        assert_eq!(m["espgate_sas"], 0);
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            route(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head: true }
        );
        assert!(matches!(
            route(b"GET / HTTP/1.1\r\n\r\n"),
            Route::Error(404, _)
        ));
        assert!(matches!(
            route(b"GET /metricsx HTTP/1.1\r\n\r\n"),
            Route::Error(404, _)
        ));
        assert!(matches!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::Error(405, _)
        ));
        assert!(matches!(
            route(b"GET /metrics\r\n\r\n"),
            Route::Error(400, _)
        ));
        assert!(matches!(
            route(b"GET /metrics HTTP/2.0\r\n\r\n"),
            Route::Error(400, _)
        ));
        assert!(matches!(route(b"\xff\xfe\r\n\r\n"), Route::Error(400, _)));
        assert_eq!(header_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(header_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(header_end(b"GET / HTTP/1.1\r\n"), None);
    }

    /// Serves `server` on this thread until `done` or 10 s.
    fn serve_until(server: &mut MetricsServer, done: impl Fn() -> bool) {
        let start = Instant::now();
        let mut fds = Vec::new();
        while !done() && start.elapsed() < Duration::from_secs(10) {
            fds.clear();
            server.poll_fds(&mut fds);
            crate::sys::poll(&mut fds, 20).unwrap();
            server.service(&fds, || "espgate_x_total 1\n".to_string());
        }
    }

    fn exchange(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn http_answers() {
        let mut server = MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let t = std::thread::spawn(move || {
            // A silent client does not hold up the others.
            let _silent = TcpStream::connect(addr).unwrap();
            let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
            let nf = exchange(addr, b"GET /nope HTTP/1.1\r\n\r\n");
            let post = exchange(
                addr,
                b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            );
            let big = exchange(addr, &[b'a'; MAX_REQUEST + 10]);
            let cut = {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /metr").unwrap();
                s.shutdown(Shutdown::Write).unwrap();
                let mut out = String::new();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.read_to_string(&mut out).unwrap();
                out
            };
            (ok, head, nf, post, big, cut)
        });
        serve_until(&mut server, || t.is_finished());
        let (ok, head, nf, post, big, cut) = t.join().unwrap();
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{ok}"
        );
        assert!(ok.contains("Connection: close\r\n"), "{ok}");
        assert!(ok.contains("Content-Length: 18\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nespgate_x_total 1\n"), "{ok}");
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(head.contains("Content-Length: 18\r\n"), "{head}");
        assert!(nf.starts_with("HTTP/1.1 404 Not Found\r\n"), "{nf}");
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{post}"
        );
        assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
        assert!(cut.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{cut}");
    }

    #[test]
    fn late_clients_are_dropped() {
        let mut server = MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr();
        let c = TcpStream::connect(addr).unwrap();
        let mut fds = Vec::new();
        for _ in 0..50 {
            fds.clear();
            server.poll_fds(&mut fds);
            crate::sys::poll(&mut fds, 20).unwrap();
            server.service(&fds, String::new);
            if !server.clients.is_empty() {
                break;
            }
        }
        assert_eq!(server.clients.len(), 1);
        server.clients[0].deadline = Instant::now() - Duration::from_secs(1);
        server.service(&[], String::new);
        assert!(server.clients.is_empty());
        drop(c);
    }

    #[test]
    fn ike_metrics() {
        use crate::ike::{IkeDoc, IkeOpCost, IkeSaStatus};
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
        assert!(
            text.contains("espgate_ike_sas{connection=\"to-b\",state=\"established\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("espgate_ike_events_total{event=\"child_rekeys\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("espgate_ike_operations_total{op=\"dh\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("espgate_ike_operation_seconds_total{op=\"dh\"} 0.00025"),
            "{text}"
        );
        parse(&text).unwrap();
    }
}
