//! The control socket's server: a Unix stream socket (mode 0600) at
//! `gateway.control_socket`, speaking the newline-delimited JSON protocol
//! of [`espgate_api::control`] — one answer line per request line, each
//! answered by [`Control::handle`].
//!
//! A client must finish within [`CLIENT_TIMEOUT`] of connecting, and at
//! most [`MAX_CLIENTS`] are served at once (more wait in the listen
//! backlog); a request line longer than
//! [`espgate_api::control::MAX_REQUEST`] gets an error and the connection
//! is closed. Request lines (which carry keys for `sa_add`) are wiped from
//! memory once answered, answer lines (keys for `wireshark_keys` and
//! `cluster_export`) once sent.

use super::accept::accept_loop;
use super::Control;
use anyhow::{bail, Context, Result};
use espgate_api::control::{parse_request, LineBuf, Response, MAX_REQUEST};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Clients served at once (more wait in the listen backlog).
pub const MAX_CLIENTS: usize = 64;
/// How long a client may take, from connecting to its last answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may stay silent, after connecting or after an
/// answer, before it is closed: a few idle connections must not hold the
/// slots an operator's `espgate status` needs.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

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

/// The bound control socket; removes its file on drop (if it is still the
/// one it created).
#[derive(Debug)]
pub struct ControlSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
    ident: (u64, u64),
}

impl ControlSocket {
    /// Binds `path` with mode 0600 (after [`check_not_running`]), creating
    /// its directory (0755) if needed.
    pub fn bind(path: &Path) -> Result<ControlSocket> {
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
        Ok(ControlSocket {
            listener: Some(listener),
            path: path.to_path_buf(),
            ident: (meta.dev(), meta.ino()),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The listener, for the control thread's runtime (once).
    pub fn take_listener(&mut self) -> Result<tokio::net::UnixListener> {
        let l = self
            .listener
            .take()
            .context("the control socket's listener was taken already")?;
        tokio::net::UnixListener::from_std(l).context("registering the control socket")
    }
}

impl Drop for ControlSocket {
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

/// Accepts clients until the stop, each answered by its own task.
pub async fn serve(
    listener: tokio::net::UnixListener,
    ctl: Arc<Control>,
    stop: watch::Receiver<bool>,
) {
    accept_loop(listener, "control socket", MAX_CLIENTS, stop, |stream| {
        let ctl = ctl.clone();
        async move {
            if tokio::time::timeout(CLIENT_TIMEOUT, client(stream, &ctl))
                .await
                .is_err()
            {
                tracing::debug!("control client: no complete request within {CLIENT_TIMEOUT:?}");
            }
        }
    })
    .await;
}

/// Answers one client's request lines until it closes.
///
/// Requests are read straight into a [`LineBuf`] rather than through a
/// `BufReader`, whose buffer would be freed with an `sa_add` request's
/// keys still in it; answers are written from
/// [`Response::to_secret_line`]. Both wipe what they held.
async fn client(stream: tokio::net::UnixStream, ctl: &Control) -> io::Result<()> {
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = LineBuf::default();
    let mut eof = false;
    // A request line must be complete within IDLE_TIMEOUT of the previous
    // answer (or of connecting).
    let mut deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
    loop {
        // The next line, with its newline, of at most MAX_REQUEST + 1 bytes.
        let (len, complete) = match buf.line_end(MAX_REQUEST + 1) {
            Some(i) => (i + 1, true),
            None if eof || buf.bytes().len() > MAX_REQUEST => {
                (buf.bytes().len().min(MAX_REQUEST + 1), false)
            }
            None => {
                let spare = buf.spare(4096);
                let Ok(read) = tokio::time::timeout_at(deadline, rd.read(spare)).await else {
                    tracing::debug!("control client: silent for {IDLE_TIMEOUT:?}; closed");
                    return Ok(());
                };
                let n = match read {
                    Ok(n) => n,
                    Err(e) => {
                        buf.filled(0);
                        return Err(e);
                    }
                };
                buf.filled(n);
                eof = n == 0;
                continue;
            }
        };
        if len == 0 {
            return Ok(());
        }
        let answer = if !complete && len > MAX_REQUEST {
            Response::error(format!("request longer than {MAX_REQUEST} bytes"))
        } else {
            let text = buf.bytes()[..len].trim_ascii();
            if text.is_empty() {
                if complete {
                    buf.consume(len);
                    deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
                    continue;
                }
                return Ok(());
            }
            match parse_request(text) {
                Ok(req) => ctl.handle(req),
                Err(e) => Response::error(e),
            }
        };
        // The request is answered: wipe it now.
        buf.consume(len);
        let out = answer.to_secret_line();
        drop(answer);
        wr.write_all(&out).await?;
        if !complete {
            // The last request, without its newline, or one too long.
            return Ok(());
        }
        deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
    }
}
