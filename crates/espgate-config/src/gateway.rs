//! The `[gateway]` table: the validated [`Gateway`], its checks, and its
//! effective table (every default filled in).

use crate::diag::{span, At, Validator};
use crate::schema::{value, Encapsulation, GatewayTable, LogLevel};
use espgate_core::selector::Prefix;
use espgate_ike::engine::{DEFAULT_COOKIE_THRESHOLD, DEFAULT_HALF_OPEN_LIMIT};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use toml::Spanned;

/// The default `control_socket`.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/espgate/espgate.sock";
/// The default `state_dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/espgate";

/// The `[gateway]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// TUN device name.
    pub tun: String,
    /// Addresses to put on the TUN device.
    pub tun_address: Vec<IfAddr>,
    /// UDP address ESP-in-UDP is received on (and sent from).
    pub listen: SocketAddr,
    /// Default encapsulation of connections.
    pub encap: Encapsulation,
    /// Data-plane threads; 0 means one per CPU (see [`Gateway::worker_threads`]).
    pub workers: u32,
    /// Path MTU of the outer network.
    pub mtu: u16,
    /// Control socket path (made absolute against the config file's directory).
    pub control_socket: PathBuf,
    /// Prometheus text endpoint, if enabled.
    pub metrics: Option<SocketAddr>,
    /// Log level.
    pub log: LogLevel,
    /// Firewall mark put on outer packets; also the routing table the
    /// daemon's routes go into when set.
    pub fwmark: Option<u32>,
    /// Directory for state kept across restarts (the reserved outbound
    /// sequence numbers), made absolute against the config file's directory.
    pub state_dir: PathBuf,
    /// Use the kernel's batching offloads (UDP GSO on send, GRO on receive).
    pub offloads: bool,
    /// Per-stage cost accounting from the start (`espgate status --costs`;
    /// `espgate costs on|off|reset` switches it at run time).
    pub cost_accounting: bool,
    /// Packets handled per ready descriptor before polling again (and the
    /// most datagrams in one GSO send), 1 to 64.
    pub batch: usize,
    /// IKE messages larger than this are sent as RFC 7383 fragments of at
    /// most this many bytes (when the peer supports fragmentation).
    pub ike_fragment_size: usize,
    /// Half-open IKE SAs (responder) from which on IKE_SA_INIT requests
    /// must return a COOKIE (RFC 7296 §2.6); 0: always.
    pub ike_cookie_threshold: usize,
    /// Half-open IKE SAs (responder) beyond which IKE_SA_INIT requests are
    /// dropped, cookie or not.
    pub ike_half_open_limit: usize,
    /// Send and receive buffer size of the outer sockets, bytes.
    pub socket_buffer: usize,
    /// The IP protocol number Q-ESP travels as (`docs/QESP.md` §1;
    /// default 253, RFC 3692's experimental number).
    pub qesp_protocol: u8,
}

impl Gateway {
    /// Number of data-plane threads to start: `workers`, or the number of
    /// CPUs when it is 0.
    pub fn worker_threads(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        }
    }

    /// The table that says exactly this gateway, every key given.
    pub fn to_table(&self) -> GatewayTable {
        let int = |n: i64| Some(value(n));
        let text = |s: String| Some(value(s));
        GatewayTable {
            tun: text(self.tun.clone()),
            tun_address: Some(
                self.tun_address
                    .iter()
                    .map(|a| value(a.to_string()))
                    .collect(),
            ),
            listen: text(self.listen.to_string()),
            encap: Some(self.encap),
            workers: int(self.workers.into()),
            mtu: int(self.mtu.into()),
            control_socket: text(self.control_socket.display().to_string()),
            metrics: self.metrics.map(|m| value(m.to_string())),
            log: Some(self.log),
            fwmark: self.fwmark.map(|m| value(m.into())),
            state_dir: text(self.state_dir.display().to_string()),
            offloads: Some(self.offloads),
            cost_accounting: Some(self.cost_accounting),
            batch: int(self.batch as i64),
            ike_fragment_size: int(self.ike_fragment_size as i64),
            ike_cookie_threshold: int(self.ike_cookie_threshold as i64),
            ike_half_open_limit: int(self.ike_half_open_limit as i64),
            socket_buffer: int(self.socket_buffer as i64),
            qesp_protocol: int(i64::from(self.qesp_protocol)),
        }
    }
}

/// An address with its prefix length, as put on an interface
/// (`10.1.0.1/24`: host bits are kept, unlike a [`Prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// The address.
    pub addr: IpAddr,
    /// Prefix length of the on-link network.
    pub prefix_len: u8,
}

impl IfAddr {
    /// The on-link network.
    pub fn network(&self) -> Prefix {
        Prefix::new(self.addr, self.prefix_len).unwrap_or_else(|| Prefix::host(self.addr))
    }
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Where the `[gateway]` table is (the whole file's start when absent).
pub(crate) fn at(t: Option<&Spanned<GatewayTable>>) -> At {
    At::root().key("gateway", t.map(Spanned::span))
}

/// Checks `[gateway]` (absent: every default).
pub(crate) fn validate(v: &mut Validator, t: Option<&Spanned<GatewayTable>>) -> Option<Gateway> {
    let before = v.error_count();
    let base = at(t);
    let empty = GatewayTable::default();
    let g = t.map_or(&empty, |t| t.get_ref());
    let tun = g
        .tun
        .as_ref()
        .map_or_else(|| "espgate0".to_string(), |s| s.get_ref().clone());
    if let Err(e) = check_ifname(&tun) {
        v.err(base.key("tun", span(&g.tun)), e);
    }
    let mut tun_address = Vec::new();
    for (i, a) in g.tun_address.iter().flatten().enumerate() {
        let here = base.key("tun_address", None).index(i, Some(a.span()));
        if let Some(a) = v.check(here, parse_ifaddr(a.get_ref())) {
            tun_address.push(a);
        }
    }
    let listen = match &g.listen {
        None => Some(SocketAddr::from(([0, 0, 0, 0], 4500))),
        Some(s) => v.check(
            base.key("listen", Some(s.span())),
            parse_socket_addr(s.get_ref(), "0.0.0.0:4500"),
        ),
    };
    let int = |k: &Option<Spanned<i64>>, default: i64| k.as_ref().map_or(default, |n| *n.get_ref());
    let workers = int(&g.workers, 1);
    if !(0..=1024).contains(&workers) {
        v.err(
            base.key("workers", span(&g.workers)),
            format!("{workers} workers: expected 0 (one per CPU) to 1024"),
        );
    }
    let ike_fragment_size = int(&g.ike_fragment_size, 1200);
    if !(300..=65000).contains(&ike_fragment_size) {
        v.err(
            base.key("ike_fragment_size", span(&g.ike_fragment_size)),
            format!("ike_fragment_size = {ike_fragment_size}: expected 300 to 65000 bytes"),
        );
    }
    let ike_cookie_threshold = int(&g.ike_cookie_threshold, DEFAULT_COOKIE_THRESHOLD as i64);
    if !(0..=1_000_000).contains(&ike_cookie_threshold) {
        v.err(
            base.key("ike_cookie_threshold", span(&g.ike_cookie_threshold)),
            format!("ike_cookie_threshold = {ike_cookie_threshold}: expected 0 (always) to 1000000 half-open IKE SAs"),
        );
    }
    let ike_half_open_limit = int(&g.ike_half_open_limit, DEFAULT_HALF_OPEN_LIMIT as i64);
    if !(1..=1_000_000).contains(&ike_half_open_limit) {
        v.err(
            base.key("ike_half_open_limit", span(&g.ike_half_open_limit)),
            format!("ike_half_open_limit = {ike_half_open_limit}: expected 1 to 1000000 half-open IKE SAs"),
        );
    }
    let batch = int(&g.batch, 64);
    if !(1..=64).contains(&batch) {
        v.err(
            base.key("batch", span(&g.batch)),
            format!("batch = {batch}: expected 1 to 64 packets"),
        );
    }
    let socket_buffer = int(&g.socket_buffer, 4 << 20);
    if !(4096..=(1 << 30)).contains(&socket_buffer) {
        v.err(
            base.key("socket_buffer", span(&g.socket_buffer)),
            format!("socket_buffer = {socket_buffer}: expected 4096 to 1073741824 bytes"),
        );
    }
    let qesp_at = base.key("qesp_protocol", span(&g.qesp_protocol));
    let qesp_protocol = int(
        &g.qesp_protocol,
        i64::from(espgate_core::wire::qesp::DEFAULT_IP_PROTOCOL),
    );
    match u8::try_from(qesp_protocol) {
        Ok(n) => {
            if let Err(e) = espgate_core::wire::qesp::check_ip_protocol(n) {
                v.err(qesp_at, e);
            }
        }
        Err(_) => v.err(
            qesp_at,
            format!("qesp_protocol = {qesp_protocol}: expected an IP protocol number, 1-254"),
        ),
    }
    let mtu = int(&g.mtu, 1500);
    if !(576..=65535).contains(&mtu) {
        v.err(
            base.key("mtu", span(&g.mtu)),
            format!("MTU {mtu} is out of range: expected 576-65535 (1280 or more with IPv6)"),
        );
    }
    let control_socket = v.base_dir.join(
        g.control_socket
            .as_ref()
            .map_or(DEFAULT_CONTROL_SOCKET, |s| s.get_ref()),
    );
    if control_socket.as_os_str().len() > 107 {
        v.err(
            base.key("control_socket", span(&g.control_socket)),
            format!(
                "{} is {} bytes long; a Unix socket path has at most 107",
                control_socket.display(),
                control_socket.as_os_str().len()
            ),
        );
    }
    let metrics = match &g.metrics {
        None => Some(None),
        Some(s) => v
            .check(
                base.key("metrics", Some(s.span())),
                parse_socket_addr(s.get_ref(), "127.0.0.1:9184"),
            )
            .map(Some),
    };
    let fwmark_at = base.key("fwmark", span(&g.fwmark));
    let fwmark = match g.fwmark.as_ref().map(|n| *n.get_ref()) {
        None => Some(None),
        Some(0) => {
            v.err(fwmark_at, "0 means no mark: omit fwmark instead");
            None
        }
        Some(n) => match u32::try_from(n) {
            Ok(m @ 252..=255) => {
                v.err(
                    fwmark_at,
                    format!(
                        "{m} is also the routing table for the daemon's routes, and tables \
                         252-255 are reserved (compat, default, main, local); pick another mark"
                    ),
                );
                None
            }
            Ok(m) => Some(Some(m)),
            Err(_) => {
                v.err(fwmark_at, format!("{n} does not fit in 32 bits"));
                None
            }
        },
    };
    let state_dir_at = base.key("state_dir", span(&g.state_dir));
    let state_dir = match g.state_dir.as_ref().map(|s| s.get_ref().trim()) {
        None => Some(PathBuf::from(DEFAULT_STATE_DIR)),
        Some("") => {
            v.err(
                state_dir_at,
                format!("an empty path: omit state_dir for the default {DEFAULT_STATE_DIR}"),
            );
            None
        }
        Some(d) => {
            let dir = v.base_dir.join(d);
            match std::fs::metadata(&dir) {
                Ok(m) if !m.is_dir() => {
                    v.err(
                        state_dir_at,
                        format!("{} exists and is not a directory", dir.display()),
                    );
                    None
                }
                _ => Some(dir),
            }
        }
    };
    if v.error_count() != before {
        return None;
    }
    Some(Gateway {
        tun,
        tun_address,
        listen: listen?,
        encap: g.encap.unwrap_or(Encapsulation::Udp),
        workers: workers as u32,
        mtu: mtu as u16,
        control_socket,
        metrics: metrics?,
        log: g.log.unwrap_or(LogLevel::Info),
        fwmark: fwmark?,
        state_dir: state_dir?,
        offloads: g.offloads.unwrap_or(true),
        cost_accounting: g.cost_accounting.unwrap_or(false),
        batch: batch.clamp(1, 64) as usize,
        ike_fragment_size: ike_fragment_size.clamp(300, 65000) as usize,
        ike_cookie_threshold: ike_cookie_threshold.clamp(0, 1_000_000) as usize,
        ike_half_open_limit: ike_half_open_limit.clamp(1, 1_000_000) as usize,
        socket_buffer: socket_buffer.clamp(4096, 1 << 30) as usize,
        qesp_protocol: qesp_protocol.clamp(0, 255) as u8,
    })
}

pub(crate) fn check_ifname(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 15 {
        return Err(format!(
            "{s:?} is {} bytes; a device name has 1-15",
            s.len()
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("{s:?} is not a valid device name"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "{s:?} contains {c:?}; a device name uses A-Z a-z 0-9 _ . -"
        ));
    }
    Ok(())
}

fn parse_ifaddr(s: &str) -> Result<IfAddr, String> {
    let (a, l) = match s.trim().split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s.trim(), None),
    };
    let addr: IpAddr = a.parse().map_err(|_| {
        format!("\"{s}\" is not an address with a prefix length like \"10.1.0.1/24\"")
    })?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix_len = match l {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(format!("\"{s}\": prefix length must be 0-{max}")),
        },
    };
    Ok(IfAddr { addr, prefix_len })
}

fn parse_socket_addr(s: &str, example: &str) -> Result<SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        format!(
            "\"{s}\" is not an address:port like \"{example}\" (IPv6 in brackets: \"[::]:4500\")"
        )
    })
}

#[cfg(test)]
mod tests {
    use crate::test_util::*;
    use crate::LogLevel;
    use std::path::Path;

    #[test]
    fn gateway_values_are_checked() {
        let g = |t: &str| format!("[gateway]\n{t}\n{}", minimal());
        assert_has(
            &err(&g("tun = \"a-very-long-tun-name\"")),
            &["gateway.tun", "1-15"],
        );
        assert_has(
            &err(&g("tun = \"tun/0\"")),
            &["gateway.tun", "contains '/'"],
        );
        assert_has(
            &err(&g("tun_address = [\"10.1.0.1/24\", \"10.1.0.1/33\"]")),
            &[
                "test.toml:2:31: gateway.tun_address[1]",
                "prefix length must be 0-32",
            ],
        );
        assert_has(
            &err(&g("listen = \"0.0.0.0:0\"")),
            &["gateway.listen", "port 0"],
        );
        assert_has(
            &err(&g("listen = \"0.0.0.0\"")),
            &["gateway.listen", "not an address:port"],
        );
        assert_has(
            &err(&g("mtu = 100")),
            &["test.toml:2:7", "gateway.mtu", "MTU 100 is out of range"],
        );
        assert_has(
            &err(&g("workers = -1")),
            &["gateway.workers", "expected 0 (one per CPU) to 1024"],
        );
        assert_has(
            &err(&g("batch = 0")),
            &["gateway.batch", "expected 1 to 64 packets"],
        );
        assert_has(
            &err(&g("ike_fragment_size = 100")),
            &["gateway.ike_fragment_size", "expected 300 to 65000 bytes"],
        );
        assert_has(
            &err(&g("socket_buffer = 100")),
            &["gateway.socket_buffer", "expected 4096"],
        );
        assert_has(&err(&g("fwmark = 0")), &["gateway.fwmark", "omit fwmark"]);
        assert_has(
            &err(&g("fwmark = 254")),
            &["gateway.fwmark", "tables 252-255 are reserved"],
        );
        assert_has(
            &err(&g("state_dir = \"\"")),
            &["gateway.state_dir", "empty path"],
        );
        let not_dir = temp_dir().join("file");
        std::fs::write(&not_dir, "x").unwrap();
        assert_has(
            &err(&g(&format!("state_dir = \"{}\"", not_dir.display()))),
            &["gateway.state_dir", "is not a directory"],
        );
        assert_has(
            &err(&g("metrics = \"localhost\"")),
            &["gateway.metrics", "not an address:port"],
        );
        assert_has(
            &err(&g("listen = \"192.0.2.9:4500\"")),
            &["connection[0].local", "gateway.listen is 192.0.2.9:4500"],
        );
        let c = parse_str(&g(
            "tun = \"wg.0_a-b\"\ntun_address = [\"10.1.0.1/24\", \"2001:db8::1\"]\nlisten = \"[::]:4600\"\n\
             workers = 4\nmtu = 9000\ncontrol_socket = \"run/x.sock\"\nmetrics = \"[::1]:9184\"\n\
             log = \"debug\"\nfwmark = 0x4500\nstate_dir = \"state\"\ncost_accounting = true\n\
             batch = 8\nsocket_buffer = 65536",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let gw = &c.gateway;
        assert_eq!(gw.tun_address[0].to_string(), "10.1.0.1/24");
        assert_eq!(gw.tun_address[0].network().to_string(), "10.1.0.0/24");
        assert_eq!(gw.tun_address[1].prefix_len, 128);
        assert_eq!(gw.control_socket, Path::new("/nonexistent/run/x.sock"));
        assert_eq!(gw.state_dir, Path::new("/nonexistent/state"));
        assert_eq!(
            (gw.workers, gw.mtu, gw.log, gw.fwmark),
            (4, 9000, LogLevel::Debug, Some(0x4500))
        );
        assert!(gw.cost_accounting);
        assert_eq!((gw.batch, gw.socket_buffer), (8, 65536));
        assert_eq!(c.connections[0].local_port, 4600);
        let v6 = minimal()
            .replace("192.0.2.1", "2001:db8::1")
            .replace("192.0.2.2", "2001:db8::2");
        assert_has(
            &err(&format!(
                "[gateway]\nmtu = 1000\nlisten = \"[::]:4500\"\n{v6}"
            )),
            &["gateway.mtu", "below 1280"],
        );
        assert_has(
            &err(&v6),
            &[
                "connection[0].local",
                "gateway.listen is 0.0.0.0:4500",
                "[::]:4500",
            ],
        );
    }
}
