//! The control socket: a Unix stream socket (mode 0600) at
//! `gateway.control_socket` speaking newline-delimited JSON. Each request
//! line gets one response line:
//!
//! ```text
//! {"cmd":"status"}   -> {"ok":true,"status":{...}}     (see status::Status)
//! {"cmd":"sa_list"}  -> {"ok":true,"sas":[{...},...]}  (see status::SaStatus)
//! {"cmd":"sa_add","conn":"NAME","dir":"in"|"out","spec":"spi=0x…,suite=…,enc=…"}
//!                    -> {"ok":true,"message":"...","warnings":[...]}
//! {"cmd":"sa_del","spi":4097[,"proto":"esp"|"ah"][,"dir":"in"|"out"][,"conn":"NAME"]}
//!                    -> {"ok":true,"message":"...","warnings":[...]}
//! {"cmd":"wireshark_keys"} -> {"ok":true,"sas":[{...,"enc_key":"hex",...}]}
//!                                                      (see wireshark::SaKeys)
//! {"cmd":"costs","action":"on"|"off"|"reset"}
//!                    -> {"ok":true,"message":"...","warnings":[]}
//!                       (per-stage cost accounting; the counts are in the
//!                       status document's "costs" while it is on)
//! anything else      -> {"ok":false,"error":"..."}
//! ```
//!
//! `sa_add` / `sa_del` change the daemon's SAs until it stops (never the
//! configuration file); see `Engine::add_sa`. `wireshark_keys` is the only
//! command that answers with key material; the socket is mode 0600 in a
//! root-owned directory, and request lines (which carry keys for `sa_add`)
//! are wiped from memory once parsed.

use serde::Deserialize;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zeroize::{Zeroize, Zeroizing};

/// Longest request line accepted.
pub const MAX_REQUEST: usize = 4096;

/// A request.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct Request {
    /// `status`, `sa_list`, `sa_add`, `sa_del`, `wireshark_keys` or `costs`.
    pub cmd: String,
    /// `sa_add`, `sa_del`: the connection's name.
    #[serde(default)]
    pub conn: Option<String>,
    /// `sa_add`, `sa_del`: `in` or `out`.
    #[serde(default)]
    pub dir: Option<String>,
    /// `sa_add`: the SA spec (with its keys; wiped on drop).
    #[serde(default)]
    pub spec: Option<String>,
    /// `sa_del`: the SPI.
    #[serde(default)]
    pub spi: Option<u32>,
    /// `sa_del`: `esp` or `ah`.
    #[serde(default)]
    pub proto: Option<String>,
    /// `costs`: `on`, `off` or `reset`.
    #[serde(default)]
    pub action: Option<String>,
}

impl Request {
    /// A request with only a command.
    pub fn new(cmd: &str) -> Request {
        Request {
            cmd: cmd.to_string(),
            conn: None,
            dir: None,
            spec: None,
            spi: None,
            proto: None,
            action: None,
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("cmd", &self.cmd)
            .field("conn", &self.conn)
            .field("dir", &self.dir)
            .field("spec", &self.spec.as_ref().map(|_| "(not shown: keys)"))
            .field("spi", &self.spi)
            .field("proto", &self.proto)
            .field("action", &self.action)
            .finish()
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(s) = &mut self.spec {
            s.zeroize();
        }
    }
}

/// Parses one request line; the error is the message to send back.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    serde_json::from_slice::<Request>(line).map_err(|e| {
        format!("bad request ({e}); send one JSON object per line, e.g. {{\"cmd\":\"status\"}}")
    })
}

/// `{"ok":false,"error":…}`.
pub fn error_response(msg: &str) -> String {
    serde_json::json!({"ok": false, "error": msg}).to_string()
}

/// Why a client request failed.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens on the socket.
    NotRunning(PathBuf, io::Error),
    /// Anything else.
    Other(anyhow::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NotRunning(p, e) => write!(
                f,
                "no espgate daemon is running on control socket {} ({e}); start one with \
                 `espgate up -c FILE`, or name its socket with -s PATH or its config with -c FILE",
                p.display()
            ),
            ClientError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

/// Sends one request to the daemon at `path` and returns its response
/// (the whole `{"ok":…}` object; an `ok: false` answer is an error).
pub fn request(
    path: &Path,
    cmd: &str,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    request_json(path, &serde_json::json!({ "cmd": cmd }), timeout)
}

/// [`request`] with a whole request object (`{"cmd":…, …}`).
pub fn request_json(
    path: &Path,
    req: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    let mut s = UnixStream::connect(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning(path.to_path_buf(), e)
        }
        _ => ClientError::Other(
            anyhow::Error::new(e).context(format!("connecting to {}", path.display())),
        ),
    })?;
    let other = |e: io::Error, what: &str| {
        ClientError::Other(anyhow::Error::new(e).context(format!("{what} {}", path.display())))
    };
    s.set_read_timeout(Some(timeout))
        .and_then(|_| s.set_write_timeout(Some(timeout)))
        .map_err(|e| other(e, "configuring"))?;
    let req = Zeroizing::new(req.to_string() + "\n");
    s.write_all(req.as_bytes())
        .map_err(|e| other(e, "writing to"))?;
    let mut line = String::new();
    BufReader::new(&s)
        .take(64 << 20)
        .read_line(&mut line)
        .map_err(|e| other(e, "reading from"))?;
    if line.is_empty() {
        return Err(ClientError::Other(anyhow::anyhow!(
            "the daemon on {} closed the connection without answering",
            path.display()
        )));
    }
    let v: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| ClientError::Other(anyhow::anyhow!("bad answer from the daemon: {e}")))?;
    if v["ok"] != serde_json::Value::Bool(true) {
        return Err(ClientError::Other(anyhow::anyhow!(
            "the daemon refused: {}",
            v["error"].as_str().unwrap_or("(no reason given)")
        )));
    }
    Ok(v)
}
