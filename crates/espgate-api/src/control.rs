//! The control protocol: a Unix stream socket (mode 0600) at
//! `gateway.control_socket` speaking newline-delimited JSON. Each request
//! line gets one answer line:
//!
//! ```text
//! {"cmd":"status"}   -> {"ok":true,"status":{...}}     (status::Status)
//! {"cmd":"sa_list"}  -> {"ok":true,"sas":[{...},...]}  (status::SaStatus)
//! {"cmd":"sa_add","conn":"NAME","dir":"in"|"out","spec":"spi=0x…,suite=…,enc=…"}
//!                    -> {"ok":true,"message":"...","warnings":[...]}
//! {"cmd":"sa_del","spi":4097[,"proto":"esp"|"ah"|"qesp"][,"dir":"in"|"out"][,"conn":"NAME"]}
//!                    -> {"ok":true,"message":"...","warnings":[...]}
//! {"cmd":"wireshark_keys"} -> {"ok":true,"sas":[{...,"enc_key":"hex",...}]}
//!                                                      (wireshark::SaKeys)
//! {"cmd":"costs","action":"on"|"off"|"reset"}
//!                    -> {"ok":true,"message":"...","warnings":[]}
//! {"cmd":"initiate","conn":"NAME"}, {"cmd":"terminate","conn":"NAME"}
//!                    -> {"ok":true,"message":"...","warnings":[]}
//! {"cmd":"cluster","plan":{"epoch":N,"members":[1,2]}|null,"leader":1,
//!  "checkpoints":[{"node":2,"spi":4097,"seq":256,"digest":...}]}
//!                    -> {"ok":true,"message":"...","warnings":[]}
//!                                                      (cluster::ClusterUpdate)
//! {"cmd":"cluster_export"}, {"cmd":"cluster_share","spi":4097,"outbound":true}
//!                    -> {"ok":true,"generation":N,"sas":[{...,"enc_key":"hex",...}]}
//!                                                      (cluster::ClusterSas)
//! anything else      -> {"ok":false,"error":"..."}
//! ```
//!
//! [`Request`] and [`Response`] are those lines as types; the daemon
//! answers every request with one `handle(Request) -> Response`, and
//! [`Client`] is the blocking client the command line, the lab and the
//! cluster agent use. `sa_add` / `sa_del` change the daemon's SAs until it
//! stops (never the configuration file). `wireshark_keys`, `cluster_export` and
//! `cluster_share` are the commands answered with key material (and
//! `cluster` the other that carries it); the socket is mode 0600 in a
//! root-owned directory, and both sides wipe the lines that carry keys
//! (an `sa_add` request, a `wireshark_keys` answer) once parsed.

use crate::status::{SaStatus, Status};
use crate::wireshark::SaKeys;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zeroize::Zeroizing;

/// Longest request line accepted (a cluster update carries a checkpoint
/// per outbound SA and node: 64 KiB holds about a thousand).
pub const MAX_REQUEST: usize = 64 << 10;

/// Longest answer line a client reads.
pub const MAX_ANSWER: u64 = 64 << 20;

/// The default control socket.
pub const DEFAULT_SOCKET: &str = "/run/espgate/espgate.sock";

/// Which way an SA carries traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaDir {
    /// The peer sends on it.
    In,
    /// We send on it.
    Out,
}

/// ESP, AH or Q-ESP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// Encapsulating Security Payload.
    Esp,
    /// Authentication Header.
    Ah,
    /// Q-ESP (`docs/QESP.md`).
    Qesp,
}

/// What `espgate costs` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CostsAction {
    /// Start per-stage cost accounting (keeping the counts if it was on).
    On,
    /// Stop it and drop the counts.
    Off,
    /// Zero the counts.
    Reset,
}

/// An SA spec in a request: it carries keys, so it is wiped on drop and
/// never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretSpec(Zeroizing<String>);

impl SecretSpec {
    /// Wraps `spec`.
    pub fn new(spec: String) -> SecretSpec {
        SecretSpec(Zeroizing::new(spec))
    }

    /// The spec text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(not shown: keys)")
    }
}

/// A request to the daemon (one JSON line, tagged by `cmd`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The status document.
    Status,
    /// Every SA.
    SaList,
    /// Install an SA on a connection (`espgate sa add`).
    SaAdd {
        /// The connection.
        conn: String,
        /// Inbound or outbound.
        dir: SaDir,
        /// The SA spec (with its keys).
        spec: SecretSpec,
    },
    /// Remove an SA (`espgate sa del`).
    SaDel {
        /// Its SPI.
        spi: u32,
        /// ESP or AH, when both have the SPI.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proto: Option<Proto>,
        /// Refuse unless the SA is of this direction.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dir: Option<SaDir>,
        /// Refuse unless the SA belongs to this connection.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        conn: Option<String>,
    },
    /// Every SA with its keys (`espgate wireshark-keys`).
    WiresharkKeys,
    /// Per-stage cost accounting on, off or reset.
    Costs {
        /// What to do.
        action: CostsAction,
    },
    /// Start a connection's IKE SA.
    Initiate {
        /// The connection.
        conn: String,
    },
    /// Delete a connection's IKE SA.
    Terminate {
        /// The connection.
        conn: String,
    },
    /// The cluster agent's once-a-second word to a cluster node: the plan
    /// in force, the leader and the other nodes' lockstep checkpoints.
    Cluster(crate::cluster::ClusterUpdate),
    /// The SAs this node shares with the cluster, keys included (the
    /// leader's agent writes them to etcd, encrypted).
    ClusterExport,
    /// Start dispatching a shared SA over the plan: the node picks the
    /// counter to do it from (ahead of its own, by about a second of
    /// traffic) and answers with the updated list.
    ClusterShare {
        /// The SA's SPI.
        spi: u32,
        /// Its direction.
        outbound: bool,
    },
}

/// What a command changed: one line for the operator, and warnings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// What changed.
    pub message: String,
    /// What the operator should know (a connection left without an SA, …).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// The daemon's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// To `status`.
    Status(Box<Status>),
    /// To `sa_list`.
    Sas(Vec<SaStatus>),
    /// To `wireshark_keys`.
    Keys(Vec<SaKeys>),
    /// To the commands that change something.
    Changed(Change),
    /// To `cluster_export` and `cluster_share`.
    ClusterSas(crate::cluster::ClusterSas),
    /// The request was refused.
    Error(String),
}

#[derive(Serialize)]
struct Ok<T> {
    ok: bool,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize, Deserialize)]
struct StatusBody {
    status: Box<Status>,
}

#[derive(Serialize, Deserialize)]
struct SasBody<T> {
    sas: Vec<T>,
}

/// Keys are serialised from where they are, never copied.
#[derive(Serialize)]
struct SasRef<'a, T> {
    sas: &'a [T],
}

#[derive(Serialize)]
struct Refusal<'a> {
    ok: bool,
    error: &'a str,
}

#[derive(Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
}

impl Response {
    /// A refusal.
    pub fn error(msg: impl Into<String>) -> Response {
        Response::Error(msg.into())
    }

    /// The JSON line (without its newline).
    pub fn to_line(&self) -> String {
        self.encode(false)
    }

    /// The answer as indented JSON, for a person (`espgate … --json`).
    pub fn to_pretty(&self) -> String {
        self.encode(true)
    }

    /// The JSON line with its newline, as the daemon sends it. An answer
    /// with keys (`wireshark_keys`, `cluster_export`, `cluster_share`) is
    /// written once at its final size (measured first) into a buffer wiped
    /// on drop, so that it leaves no copy in freed memory, as a growing
    /// buffer's old allocations would.
    pub fn to_secret_line(&self) -> Zeroizing<Vec<u8>> {
        let mut out = match self {
            Response::Keys(_) | Response::ClusterSas(_) => secret_json(|w| self.write(w, false), 1)
                .unwrap_or_else(|e| {
                    Zeroizing::new(
                        format!(r#"{{"ok":false,"error":"encoding the answer: {e}"}}"#)
                            .into_bytes(),
                    )
                }),
            // No keys: encoded once, as before.
            _ => Zeroizing::new(self.to_line().into_bytes()),
        };
        out.push(b'\n');
        out
    }

    fn encode(&self, pretty: bool) -> String {
        let mut out = Vec::new();
        match self.write(&mut out, pretty) {
            // serde_json writes UTF-8 only.
            Ok(()) => String::from_utf8(out).unwrap_or_default(),
            Err(e) => format!(r#"{{"ok":false,"error":"encoding the answer: {e}"}}"#),
        }
    }

    fn write(&self, w: &mut dyn Write, pretty: bool) -> serde_json::Result<()> {
        fn enc<T: Serialize>(w: &mut dyn Write, v: &T, pretty: bool) -> serde_json::Result<()> {
            if pretty {
                serde_json::to_writer_pretty(w, v)
            } else {
                serde_json::to_writer(w, v)
            }
        }
        match self {
            Response::Status(s) => enc(
                w,
                &Ok {
                    ok: true,
                    body: StatusBody { status: s.clone() },
                },
                pretty,
            ),
            Response::Sas(sas) => enc(
                w,
                &Ok {
                    ok: true,
                    body: SasBody { sas: sas.clone() },
                },
                pretty,
            ),
            Response::Keys(keys) => enc(
                w,
                &Ok {
                    ok: true,
                    body: SasRef { sas: keys },
                },
                pretty,
            ),
            Response::Changed(c) => enc(w, &Ok { ok: true, body: c }, pretty),
            Response::ClusterSas(c) => enc(w, &Ok { ok: true, body: c }, pretty),
            Response::Error(e) => enc(
                w,
                &Refusal {
                    ok: false,
                    error: e,
                },
                pretty,
            ),
        }
    }

    /// Parses the answer `line` to `req` (the answer's shape depends on
    /// the request).
    pub fn parse(req: &Request, line: &[u8]) -> Result<Response, String> {
        let bad = |e: serde_json::Error| format!("bad answer from the daemon: {e}");
        let env: Envelope = serde_json::from_slice(line).map_err(bad)?;
        if !env.ok {
            return Ok(Response::Error(
                env.error.unwrap_or_else(|| "(no reason given)".into()),
            ));
        }
        Ok(match req {
            Request::Status => Response::Status(
                serde_json::from_slice::<StatusBody>(line)
                    .map_err(bad)?
                    .status,
            ),
            Request::SaList => Response::Sas(
                serde_json::from_slice::<SasBody<SaStatus>>(line)
                    .map_err(bad)?
                    .sas,
            ),
            Request::WiresharkKeys => Response::Keys(
                serde_json::from_slice::<SasBody<SaKeys>>(line)
                    .map_err(bad)?
                    .sas,
            ),
            Request::ClusterExport | Request::ClusterShare { .. } => {
                Response::ClusterSas(serde_json::from_slice(line).map_err(bad)?)
            }
            _ => Response::Changed(serde_json::from_slice(line).map_err(bad)?),
        })
    }
}

/// Parses one request line; the error is the message to send back.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    serde_json::from_slice::<Request>(line).map_err(|e| {
        format!(
            "bad request ({e}); send one JSON object per line, e.g. {{\"cmd\":\"status\"}}; the \
             commands are status, sa_list, sa_add, sa_del, wireshark_keys, costs, initiate, \
             terminate, cluster, cluster_export and cluster_share"
        )
    })
}

/// Counts the bytes written to it.
struct Count(usize);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What `write` writes (JSON that may carry keys), in a buffer wiped on
/// drop with room for `extra` bytes more. `write` runs twice: once to
/// measure, once into a buffer of exactly that size, so the buffer never
/// grows (a `Vec` that grows frees its old allocation unwiped).
pub fn secret_json(
    write: impl Fn(&mut dyn Write) -> serde_json::Result<()>,
    extra: usize,
) -> serde_json::Result<Zeroizing<Vec<u8>>> {
    let mut count = Count(0);
    write(&mut count)?;
    let mut out = Zeroizing::new(Vec::with_capacity(count.0 + extra));
    write(&mut *out)?;
    Ok(out)
}

/// A byte buffer for protocol lines that may carry keys (an `sa_add`
/// request, a `wireshark_keys` answer): wiped on drop, and when it grows
/// its content moves to a new allocation and the old one is wiped before
/// it is freed (`Vec`'s own growth would leave a copy in freed memory).
/// Consumed lines are wiped at once.
#[derive(Default)]
pub struct LineBuf {
    buf: Zeroizing<Vec<u8>>,
    /// Where the slice [`LineBuf::spare`] handed out begins.
    reading: usize,
}

impl LineBuf {
    /// The bytes held.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// A zeroed slice of at least `min` bytes at the end, to read into;
    /// then [`LineBuf::filled`] says how many were read.
    pub fn spare(&mut self, min: usize) -> &mut [u8] {
        let len = self.buf.len();
        if self.buf.capacity() - len < min {
            let cap = (len + min).max(self.buf.capacity() * 2);
            let mut grown = Zeroizing::new(Vec::with_capacity(cap));
            grown.extend_from_slice(&self.buf);
            // The old allocation is wiped as it drops.
            self.buf = grown;
        }
        // Within the capacity: no reallocation.
        let cap = self.buf.capacity();
        self.buf.resize(cap, 0);
        self.reading = len;
        &mut self.buf[len..]
    }

    /// Keeps the first `n` bytes of the last [`LineBuf::spare`] slice.
    pub fn filled(&mut self, n: usize) {
        let keep = (self.reading + n).min(self.buf.len());
        zeroize::Zeroize::zeroize(&mut self.buf[keep..]);
        self.buf.truncate(keep);
        self.reading = keep;
    }

    /// The end of the first line (the index of its newline) among the
    /// first `limit` bytes.
    pub fn line_end(&self, limit: usize) -> Option<usize> {
        let n = self.buf.len().min(limit);
        self.buf[..n].iter().position(|b| *b == b'\n')
    }

    /// Drops the first `n` bytes (a line answered), wiping them.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.buf.len());
        self.buf.copy_within(n.., 0);
        let keep = self.buf.len() - n;
        zeroize::Zeroize::zeroize(&mut self.buf[keep..]);
        self.buf.truncate(keep);
    }
}

/// Why a client request failed.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens on the socket.
    NotRunning(PathBuf, io::Error),
    /// The daemon answered with a refusal.
    Refused(String),
    /// Anything else (I/O, a broken answer).
    Other(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NotRunning(p, e) => write!(
                f,
                "no espgate daemon is running on control socket {} ({e}); start one with \
                 `espgate up -c FILE`, or name its socket with -s PATH or its config with -c FILE",
                p.display()
            ),
            ClientError::Refused(e) => write!(f, "the daemon refused: {e}"),
            ClientError::Other(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ClientError {}

/// A blocking client of one daemon's control socket: one connection per
/// request.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    timeout: Duration,
}

impl Client {
    /// The daemon at `path`, waiting at most `timeout` for each answer.
    pub fn new(path: impl Into<PathBuf>, timeout: Duration) -> Client {
        Client {
            path: path.into(),
            timeout,
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `req` and returns the answer; a refusal is
    /// [`ClientError::Refused`].
    pub fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let path = &self.path;
        let mut s = UnixStream::connect(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                ClientError::NotRunning(path.to_path_buf(), e)
            }
            _ => ClientError::Other(format!("connecting to {}: {e}", path.display())),
        })?;
        let io = |e: io::Error, what: &str| {
            ClientError::Other(format!("{what} {}: {e}", path.display()))
        };
        s.set_read_timeout(Some(self.timeout))
            .and_then(|_| s.set_write_timeout(Some(self.timeout)))
            .map_err(|e| io(e, "configuring"))?;
        // Written at its final size (an `sa_add` or `cluster` request may
        // carry keys: a growing buffer would free copies of them).
        let mut line = secret_json(|w| serde_json::to_writer(w, req), 1)
            .map_err(|e| ClientError::Other(format!("encoding: {e}")))?;
        line.push(b'\n');
        s.write_all(&line).map_err(|e| io(e, "writing to"))?;
        // Read straight into a buffer that wipes what it held (answers may
        // carry keys), up to the newline, the end, or MAX_ANSWER bytes.
        let mut answer = LineBuf::default();
        let end = loop {
            if let Some(i) = answer.line_end(usize::MAX) {
                break i + 1;
            }
            let len = answer.bytes().len();
            if len as u64 >= MAX_ANSWER {
                break len;
            }
            let spare = answer.spare(4096);
            let room = spare.len().min((MAX_ANSWER - len as u64) as usize);
            match (&s).read(&mut spare[..room]) {
                Ok(0) => {
                    answer.filled(0);
                    break len;
                }
                Ok(n) => answer.filled(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => answer.filled(0),
                Err(e) => return Err(io(e, "reading from")),
            }
        };
        let answer = &answer.bytes()[..end];
        if answer.is_empty() {
            return Err(ClientError::Other(format!(
                "the daemon on {} closed the connection without answering",
                path.display()
            )));
        }
        match Response::parse(req, answer.trim_ascii()).map_err(ClientError::Other)? {
            Response::Error(e) => Err(ClientError::Refused(e)),
            r => Ok(r),
        }
    }

    /// The status document.
    pub fn status(&self) -> Result<Status, ClientError> {
        match self.call(&Request::Status)? {
            Response::Status(s) => Ok(*s),
            other => Err(unexpected(&other)),
        }
    }

    /// Every SA.
    pub fn sa_list(&self) -> Result<Vec<SaStatus>, ClientError> {
        match self.call(&Request::SaList)? {
            Response::Sas(s) => Ok(s),
            other => Err(unexpected(&other)),
        }
    }

    /// Every SA with its keys.
    pub fn wireshark_keys(&self) -> Result<Vec<SaKeys>, ClientError> {
        match self.call(&Request::WiresharkKeys)? {
            Response::Keys(k) => Ok(k),
            other => Err(unexpected(&other)),
        }
    }

    /// The SAs a cluster node shares (`cluster_export`, `cluster_share`).
    pub fn cluster_sas(&self, req: &Request) -> Result<crate::cluster::ClusterSas, ClientError> {
        match self.call(req)? {
            Response::ClusterSas(c) => Ok(c),
            other => Err(unexpected(&other)),
        }
    }

    /// A command that changes something (`sa_add`, `sa_del`, `costs`,
    /// `initiate`, `terminate`).
    pub fn change(&self, req: &Request) -> Result<Change, ClientError> {
        match self.call(req)? {
            Response::Changed(c) => Ok(c),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(r: &Response) -> ClientError {
    let what = match r {
        Response::Status(_) => "a status document",
        Response::Sas(_) => "an SA list",
        Response::Keys(_) => "SA keys",
        Response::Changed(_) => "a change",
        Response::ClusterSas(_) => "a cluster SA list",
        Response::Error(_) => "an error",
    };
    ClientError::Other(format!(
        "the daemon answered with {what}, not what was asked"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_keep_their_wire_form() {
        for (line, req) in [
            (r#"{"cmd":"status"}"#, Request::Status),
            (r#"{"cmd":"sa_list"}"#, Request::SaList),
            (
                r#"{"cmd":"sa_add","conn":"b","dir":"in","spec":"spi=1"}"#,
                Request::SaAdd {
                    conn: "b".into(),
                    dir: SaDir::In,
                    spec: SecretSpec::new("spi=1".into()),
                },
            ),
            (
                r#"{"cmd":"sa_del","spi":4097,"proto":"esp"}"#,
                Request::SaDel {
                    spi: 4097,
                    proto: Some(Proto::Esp),
                    dir: None,
                    conn: None,
                },
            ),
            (r#"{"cmd":"wireshark_keys"}"#, Request::WiresharkKeys),
            (
                r#"{"cmd":"costs","action":"reset"}"#,
                Request::Costs {
                    action: CostsAction::Reset,
                },
            ),
            (
                r#"{"cmd":"initiate","conn":"x"}"#,
                Request::Initiate { conn: "x".into() },
            ),
            (
                r#"{"cmd":"terminate","conn":"x"}"#,
                Request::Terminate { conn: "x".into() },
            ),
            (
                r#"{"cmd":"cluster","plan":{"epoch":3,"members":[1,3]},"leader":1,"checkpoints":[{"node":3,"spi":4097,"seq":512,"digest":99}]}"#,
                Request::Cluster(crate::cluster::ClusterUpdate {
                    plan: Some(crate::cluster::PlanDoc {
                        epoch: 3,
                        members: vec![1, 3],
                    }),
                    leader: Some(1),
                    checkpoints: vec![crate::cluster::PeerCheckpoint {
                        node: 3,
                        spi: 4097,
                        seq: 512,
                        digest: 99,
                    }],
                    sas: None,
                    ike: None,
                }),
            ),
            (r#"{"cmd":"cluster_export"}"#, Request::ClusterExport),
            (
                r#"{"cmd":"cluster_share","spi":4097,"outbound":true}"#,
                Request::ClusterShare {
                    spi: 4097,
                    outbound: true,
                },
            ),
        ] {
            assert_eq!(parse_request(line.as_bytes()).unwrap(), req, "{line}");
            assert_eq!(serde_json::to_string(&req).unwrap(), line);
        }
    }

    #[test]
    fn a_shared_sa_travels_with_its_keys_but_never_prints_them() {
        let sa = crate::cluster::SharedSa {
            conn: "site".into(),
            outbound: true,
            protocol: "esp".into(),
            spi: 0xc0de,
            suite: "aes128gcm16".into(),
            enc_key: "00112233445566778899aabbccddeeff01020304".into(),
            integ_key: String::new(),
            esn: true,
            encap: Some((4500, 4500)),
            peer: None,
            owner: 2,
            share_from: None,
            selectors: vec!["10.1.0.0/16 10.2.1.0/24 any 0-65535 0-65535".into()],
        };
        let shown = format!("{sa:?}");
        assert!(!shown.contains("001122"), "{shown}");
        assert_eq!(sa.name(), "0x0000c0de-out");
        let answer = Response::ClusterSas(crate::cluster::ClusterSas {
            generation: 7,
            sas: vec![sa.clone()],
            ike: vec![],
        });
        let back = Response::parse(&Request::ClusterExport, answer.to_line().as_bytes()).unwrap();
        assert_eq!(back, answer);
        let update = Request::Cluster(crate::cluster::ClusterUpdate {
            plan: None,
            leader: Some(2),
            checkpoints: vec![],
            sas: Some(vec![sa]),
            ike: None,
        });
        let line = serde_json::to_string(&update).unwrap();
        assert_eq!(parse_request(line.as_bytes()).unwrap(), update);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let e = parse_request(br#"{"cmd":"nope"}"#).unwrap_err();
        assert!(
            e.contains("unknown variant `nope`") && e.contains("sa_list"),
            "{e}"
        );
        let e = parse_request(br#"{"cmd":"sa_add","conn":"peer"}"#).unwrap_err();
        assert!(e.contains("missing field `dir`"), "{e}");
        let e = parse_request(br#"{"cmd":"sa_add","conn":"peer","dir":"sideways","spec":"x"}"#)
            .unwrap_err();
        assert!(
            e.contains("unknown variant `sideways`") && e.contains("`in`"),
            "{e}"
        );
        // A misspelt field is refused, not ignored.
        let e = parse_request(br#"{"cmd":"sa_del","spi":1,"protocol":"esp"}"#).unwrap_err();
        assert!(e.contains("unknown field `protocol`"), "{e}");
        let e = parse_request(b"not json").unwrap_err();
        assert!(e.starts_with("bad request"), "{e}");
    }

    #[test]
    fn keys_never_show_in_debug() {
        let r = parse_request(br#"{"cmd":"sa_add","conn":"b","dir":"in","spec":"enc=00112233"}"#)
            .unwrap();
        let d = format!("{r:?}");
        assert!(!d.contains("00112233") && d.contains("not shown"), "{d}");
    }

    #[test]
    fn answers_round_trip_by_request() {
        let change = Response::Changed(Change {
            message: "done".into(),
            warnings: vec!["careful".into()],
        });
        let line = change.to_line();
        assert_eq!(
            line,
            r#"{"ok":true,"message":"done","warnings":["careful"]}"#
        );
        let req = Request::Costs {
            action: CostsAction::On,
        };
        assert_eq!(Response::parse(&req, line.as_bytes()).unwrap(), change);
        let err = Response::error("no such connection");
        assert_eq!(
            err.to_line(),
            r#"{"ok":false,"error":"no such connection"}"#
        );
        assert_eq!(
            Response::parse(&req, err.to_line().as_bytes()).unwrap(),
            err
        );
        let sas = Response::Sas(Vec::new());
        assert_eq!(sas.to_line(), r#"{"ok":true,"sas":[]}"#);
        assert_eq!(
            Response::parse(&Request::SaList, b"{\"ok\":true,\"sas\":[]}").unwrap(),
            sas
        );
        assert!(Response::parse(&Request::SaList, b"{\"ok\":true}").is_err());
    }

    fn key_answer() -> Response {
        Response::Keys(vec![SaKeys {
            connection: "b".into(),
            direction: "out".into(),
            protocol: "esp".into(),
            spi: 0x1001,
            suite: "aes128gcm16".into(),
            mode: "tunnel".into(),
            src: "192.0.2.1".into(),
            dst: "192.0.2.2".into(),
            sport: Some(4500),
            dport: Some(4500),
            esn: false,
            enc_key: "00112233445566778899aabbccddeeff01020304".into(),
            integ_key: String::new(),
        }])
    }

    #[test]
    fn the_secret_line_is_the_line_written_at_its_final_size() {
        for r in [
            key_answer(),
            Response::error("no"),
            Response::Sas(Vec::new()),
        ] {
            let line = r.to_secret_line();
            assert_eq!(&line[..], format!("{}\n", r.to_line()).as_bytes());
        }
        // Keys: measured first, never grown, so no unwiped copy was freed.
        let line = key_answer().to_secret_line();
        assert_eq!(line.capacity(), line.len());
        let json = secret_json(|w| serde_json::to_writer(w, "x"), 3).unwrap();
        assert_eq!((&json[..], json.capacity()), (&b"\"x\""[..], 6));
    }

    #[test]
    fn a_line_buffer_reads_lines_and_wipes_what_it_drops() {
        let mut b = LineBuf::default();
        let first = b"{\"cmd\":\"sa_add\",\"spec\":\"enc=0011\"}\n{\"cmd\"";
        let spare = b.spare(4);
        assert!(spare.len() >= 4 && spare.iter().all(|x| *x == 0));
        let n = spare.len().min(first.len());
        spare[..n].copy_from_slice(&first[..n]);
        b.filled(n);
        assert_eq!(b.bytes(), &first[..n]);
        // Growing keeps what was read.
        while b.bytes().len() < first.len() {
            let at = b.bytes().len();
            let spare = b.spare(first.len());
            let n = spare.len().min(first.len() - at);
            spare[..n].copy_from_slice(&first[at..at + n]);
            b.filled(n);
        }
        assert_eq!(b.bytes(), &first[..]);
        let end = b.line_end(usize::MAX).unwrap();
        assert_eq!(Some(end), first.iter().position(|x| *x == b'\n'));
        assert_eq!(b.line_end(10), None, "not within the limit");
        b.consume(end + 1);
        assert_eq!(b.bytes(), b"{\"cmd\"");
        assert_eq!(b.line_end(usize::MAX), None);
        // The answered line is gone from the allocation too, not only from
        // the visible bytes.
        let held = b.buf.len();
        // SAFETY: within the vector's capacity, all of it initialised by
        // `spare` (zeroes or bytes read).
        let rest = unsafe { std::slice::from_raw_parts(b.buf.as_ptr().add(held), end) };
        assert!(rest.iter().all(|x| *x == 0), "{rest:?}");
        b.spare(1);
        b.filled(0);
        assert_eq!(b.bytes(), b"{\"cmd\"");
    }
}
