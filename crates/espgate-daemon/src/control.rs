//! The control socket's server side: a Unix stream socket (mode 0600) at
//! `gateway.control_socket`, speaking the newline-delimited JSON protocol
//! of [`espgate_api::control`] (one response line per request line).
//!
//! The server is non-blocking and driven by a poll loop; a client that does
//! not finish a request within [`CLIENT_TIMEOUT`] is disconnected, and at
//! most [`MAX_CLIENTS`] are served at once. Request lines (which carry keys
//! for `sa_add`) are wiped from memory once parsed.

use anyhow::{bail, Context, Result};
pub use espgate_api::control::{error_response, parse_request, request, ClientError, Request};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zeroize::{Zeroize, Zeroizing};

use espgate_api::control::MAX_REQUEST;
/// Clients served at once.
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Binds a Unix stream socket at `path` that only its owner can connect
/// to, at no moment reachable by others, and without the process-wide
/// umask (other threads may be creating files meanwhile): the socket is
/// bound inside a new mode-0700 directory next to `path`, made 0600, then
/// renamed into place.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let private = parent.join(format!(".eg{:x}", std::process::id()));
    if std::fs::symlink_metadata(&private).is_ok() {
        // Left by a process with our pid that died mid-bind: ours to remove.
        std::fs::remove_dir_all(&private)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let tmp = private.join("s");
    let r = (|| {
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
        let l = UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(l)
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&private);
    r
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
        let listener = bind_private(path)
            .with_context(|| format!("binding control socket {}", path.display()))?;
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
            crate::sys::poll(&mut fds, 20).unwrap();
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
