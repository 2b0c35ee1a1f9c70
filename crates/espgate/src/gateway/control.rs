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
//!
//! The server side is non-blocking and driven by the data-plane loop's
//! `poll`; a client that does not finish a request within
//! [`CLIENT_TIMEOUT`] is disconnected, and at most [`MAX_CLIENTS`] are
//! served at once.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zeroize::{Zeroize, Zeroizing};

/// Longest request line accepted.
const MAX_REQUEST: usize = 4096;
/// Clients served at once.
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

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

struct Client {
    stream: UnixStream,
    input: Vec<u8>,
    output: Vec<u8>,
    deadline: Instant,
    eof: bool,
}

/// The listening socket and its clients.
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    ident: (u64, u64),
    clients: Vec<Client>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("path", &self.path)
            .field("clients", &self.clients.len())
            .finish()
    }
}

/// Fails if a daemon answers on `path`; removes a stale socket file left
/// by a daemon that died. Refuses to touch anything that is not a socket.
pub fn check_not_running(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        bail!(
            "control socket path {} exists and is not a socket; remove it or set \
             gateway.control_socket",
            path.display()
        );
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!(
            "another espgate daemon is running: it answers on {}",
            path.display()
        ),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!("removing stale control socket {}", path.display());
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale control socket {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("probing control socket {}", path.display())),
    }
}

impl ControlServer {
    /// Binds `path` with mode 0600 (after [`check_not_running`]), creating
    /// its directory (0755) if needed.
    pub fn bind(path: &Path) -> Result<ControlServer> {
        check_not_running(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
        }
        // The socket is created with mode 0777 & ~umask: make it 0600 from
        // the start (the process is single-threaded here).
        // SAFETY: umask only swaps the process's file-creation mask.
        let old = unsafe { libc::umask(0o177) };
        let r = UnixListener::bind(path);
        // SAFETY: as above, restoring the previous mask.
        unsafe { libc::umask(old) };
        let listener = r.with_context(|| format!("binding control socket {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 600 {}", path.display()))?;
        listener.set_nonblocking(true)?;
        let meta = std::fs::metadata(path)?;
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
            ident: (meta.dev(), meta.ino()),
            clients: Vec::new(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptors to poll and the events wanted: the listener first,
    /// then one per client.
    pub fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        let room = self.clients.len() < MAX_CLIENTS;
        out.push(libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: if room { libc::POLLIN } else { 0 },
            revents: 0,
        });
        for c in &self.clients {
            let mut events = 0;
            if !c.eof {
                events |= libc::POLLIN;
            }
            if !c.output.is_empty() {
                events |= libc::POLLOUT;
            }
            out.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events,
                revents: 0,
            });
        }
    }

    /// Does the work `poll` found (`fds` as filled by [`Self::poll_fds`],
    /// with `revents`), answering each complete request line with
    /// `answer(request)`, and drops clients that are done, broken or late.
    pub fn service(&mut self, fds: &[libc::pollfd], mut answer: impl FnMut(&Request) -> String) {
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
                                eof: false,
                            });
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::debug!("control socket accept: {e}");
                        break;
                    }
                }
            }
        }
        // Client i was polled as fds[1 + i]; clients accepted just now
        // come last and were not polled.
        let mut i = 0;
        self.clients.retain_mut(|c| {
            let revents = fds
                .get(1 + i)
                .filter(|p| p.fd == c.stream.as_raw_fd())
                .map_or(0, |p| p.revents);
            i += 1;
            if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && !c.eof {
                let mut chunk = [0u8; 1024];
                loop {
                    match c.stream.read(&mut chunk) {
                        Ok(0) => {
                            c.eof = true;
                            break;
                        }
                        Ok(n) => c.input.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => return false,
                    }
                    if c.input.len() > MAX_REQUEST {
                        break;
                    }
                }
                chunk.zeroize();
                while let Some(pos) = c.input.iter().position(|&b| b == b'\n') {
                    let line: Zeroizing<Vec<u8>> = Zeroizing::new(c.input.drain(..=pos).collect());
                    let line = line.trim_ascii();
                    if line.is_empty() {
                        continue;
                    }
                    let resp = match parse_request(line) {
                        Ok(r) => answer(&r),
                        Err(e) => error_response(&e),
                    };
                    c.output.extend_from_slice(resp.as_bytes());
                    c.output.push(b'\n');
                }
                if c.input.len() > MAX_REQUEST {
                    c.output.extend_from_slice(
                        error_response(&format!("request longer than {MAX_REQUEST} bytes"))
                            .as_bytes(),
                    );
                    c.output.push(b'\n');
                    c.input.zeroize();
                    c.eof = true;
                }
                if c.eof && !c.input.trim_ascii().is_empty() {
                    // A last request without its newline.
                    let line = Zeroizing::new(std::mem::take(&mut c.input));
                    let resp = match parse_request(line.trim_ascii()) {
                        Ok(r) => answer(&r),
                        Err(e) => error_response(&e),
                    };
                    c.output.extend_from_slice(resp.as_bytes());
                    c.output.push(b'\n');
                }
            }
            while !c.output.is_empty() {
                match c.stream.write(&c.output) {
                    Ok(0) => return false,
                    Ok(n) => drop(c.output.drain(..n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return false,
                }
            }
            if c.eof && c.output.is_empty() {
                return false;
            }
            now < c.deadline
        });
    }
}

impl Drop for ControlServer {
    /// Removes the socket file, if it is still the one we created.
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.ident {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!("removing {}: {e}", self.path.display());
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn temp_sock() -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "espgate-ctl-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d.join("ctl.sock")
    }

    /// Serves `server` on this thread until `done` or 10 s.
    fn serve_until(server: &mut ControlServer, done: impl Fn() -> bool) {
        let start = Instant::now();
        let mut fds = Vec::new();
        while !done() && start.elapsed() < Duration::from_secs(10) {
            fds.clear();
            server.poll_fds(&mut fds);
            crate::gateway::sys::poll(&mut fds, 20).unwrap();
            server.service(&fds, |r| match r.cmd.as_str() {
                "status" => r#"{"ok":true,"status":{"x":1}}"#.to_string(),
                other => error_response(&format!("unknown command {other:?}")),
            });
        }
    }

    #[test]
    fn requests_answers_and_cleanup() {
        let path = temp_sock();
        let mut server = ControlServer::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second daemon is refused while this one answers.
        let p2 = path.clone();
        let t = std::thread::spawn(move || {
            let second = check_not_running(&p2).unwrap_err().to_string();
            let ok = request(&p2, "status", Duration::from_secs(5)).unwrap();
            let bad = request(&p2, "nope", Duration::from_secs(5))
                .unwrap_err()
                .to_string();
            // Two requests on one connection, then garbage.
            let mut s = UnixStream::connect(&p2).unwrap();
            s.write_all(b"{\"cmd\":\"status\"}\n\n{\"cmd\":\"status\"}\nnot json\n")
                .unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut all = String::new();
            s.read_to_string(&mut all).unwrap();
            (second, ok, bad, all)
        });
        serve_until(&mut server, || t.is_finished());
        let (second, ok, bad, all) = t.join().unwrap();
        assert!(
            second.contains("another espgate daemon is running"),
            "{second}"
        );
        assert_eq!(ok["status"]["x"], 1);
        assert!(bad.contains("unknown command \"nope\""), "{bad}");
        let lines: Vec<&str> = all.lines().collect();
        assert_eq!(lines.len(), 3, "{all}");
        assert!(lines[2].contains("bad request"), "{all}");
        drop(server);
        assert!(!path.exists(), "socket removed on drop");
        // Nothing running: a clear error naming the path.
        let e = request(&path, "status", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ClientError::NotRunning(..)));
        assert!(e.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn stale_socket_is_replaced_and_other_files_are_not() {
        let path = temp_sock();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // A socket nobody listens on (its listener was closed without unlinking).
        drop(UnixListener::bind(&path).unwrap());
        let e = request(&path, "status", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ClientError::NotRunning(..)), "{e}");
        let server = ControlServer::bind(&path).unwrap();
        drop(server);
        std::fs::write(&path, "not a socket").unwrap();
        let e = ControlServer::bind(&path).unwrap_err().to_string();
        assert!(e.contains("is not a socket"), "{e}");
        assert!(path.exists());
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_silent_client_does_not_block_others() {
        let path = temp_sock();
        let mut server = ControlServer::bind(&path).unwrap();
        let _silent = UnixStream::connect(&path).unwrap();
        let p2 = path.clone();
        let t = std::thread::spawn(move || request(&p2, "status", Duration::from_secs(5)).is_ok());
        serve_until(&mut server, || t.is_finished());
        assert!(t.join().unwrap());
    }
}
