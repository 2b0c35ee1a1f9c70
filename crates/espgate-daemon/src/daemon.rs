//! Running in the background and telling others we are up:
//! `espgate up --daemon` (fork, report readiness or the start-up error
//! back to the waiting parent through a pipe), the pid file, and systemd's
//! readiness notification (`sd_notify(3)`'s `READY=1`, for `Type=notify`).
//!
//! [`detach`] forks once, before the gateway starts: the parent waits for
//! the child's report and exits 0 once the daemon is fully up (TUN,
//! routes, sockets, control socket) or 1 with the daemon's error, after the
//! child, having undone everything, has exited. The child starts a new
//! session (`setsid`), so it has no controlling terminal, moves to `/`,
//! reads `/dev/null` and writes its log (stdout and stderr) to the log
//! file. It must be called while the process has a single thread.
//!
//! The process calls go through `nix` (`fork`, `waitpid`, `kill`: `rustix`
//! 1.1 has no `fork` but an unsafe raw `kernel_fork` that skips libc's
//! `atfork` handlers, and `nix` keeps one `Pid` type for the three); the
//! descriptor calls through `rustix` (`pipe2`, `dup2`, `setsid`, `poll`).

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the parent waits for the daemon to come up.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the parent waits for a daemon that failed to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest report read from the daemon.
const MAX_REPORT: usize = 64 * 1024;

/// The default pid file: the control socket's path with the extension
/// `pid` (`/run/espgate/espgate.sock` → `/run/espgate/espgate.pid`), so
/// that daemons with different control sockets do not share one.
pub fn default_pid_file(control_socket: &Path) -> PathBuf {
    control_socket.with_extension("pid")
}

/// The default log file of a detached daemon:
/// `/var/log/espgate/STEM.log` for the configuration file `STEM.toml`.
pub fn default_log_file(config: &Path) -> PathBuf {
    let stem = config
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "espgate".into());
    Path::new("/var/log/espgate").join(format!("{stem}.log"))
}

/// Threads of this process (from `/proc/self/task`).
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// What [`detach`] returns in each process.
#[derive(Debug)]
pub enum Role {
    /// The original process: how the daemon's start-up went.
    Parent(Outcome),
    /// The daemon: start the gateway, then [`Reporter::ready`] or
    /// [`Reporter::failed`].
    Daemon(Reporter),
}

/// How the daemon's start-up went, as the parent saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Up and running.
    Ready {
        /// The daemon's process id.
        pid: u32,
    },
    /// Not running (any more): the daemon's error, or what happened to it.
    Failed {
        /// Why.
        message: String,
    },
}

/// The daemon's end of the report pipe.
#[derive(Debug)]
pub struct Reporter {
    pipe: Option<File>,
}

impl Reporter {
    fn send(&mut self, msg: &str) {
        if let Some(mut p) = self.pipe.take() {
            // The parent may have gone (Ctrl-C): nothing to do about it.
            let _ = p.write_all(msg.as_bytes());
        }
    }

    /// Tells the parent the daemon is up; it exits 0.
    pub fn ready(&mut self) {
        self.send("READY\n");
    }

    /// Tells the parent start-up failed with `error` (everything undone);
    /// it prints the error and exits 1 once this process has exited.
    pub fn failed(&mut self, error: &str) {
        self.send(&format!("ERROR\n{error}"));
    }

    /// Whether the parent is still waiting for a report.
    pub fn pending(&self) -> bool {
        self.pipe.is_some()
    }
}

/// Opens (creates, appends to, mode 0640) the log file, creating its
/// directory (0755) if needed.
fn open_log(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .with_context(|| format!("creating log directory {}", dir.display()))?;
        }
    }
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
        .with_context(|| format!("opening log file {}", path.display()))
}

/// A pipe (read end, write end), both close-on-exec.
pub(crate) fn pipe() -> io::Result<(File, File)> {
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((File::from(rd), File::from(wr)))
}

/// The child's side after `fork`: new session, standard descriptors, `/`.
fn become_daemon(log: &File) -> io::Result<()> {
    // The child of a fork is not a process group leader, so this succeeds.
    rustix::process::setsid().map_err(crate::sys::context("setsid"))?;
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null).map_err(crate::sys::context("dup2 to stdin"))?;
    rustix::stdio::dup2_stdout(log).map_err(crate::sys::context("dup2 to stdout"))?;
    rustix::stdio::dup2_stderr(log).map_err(crate::sys::context("dup2 to stderr"))?;
    std::env::set_current_dir("/")
}

/// Forks into the background (see the module documentation). `log_file`
/// receives the daemon's stdout and stderr; it is opened before the fork,
/// so an error with it is reported here. Relative paths the daemon uses
/// later must be made absolute before, as it moves to `/`.
pub fn detach(log_file: &Path) -> Result<Role> {
    let threads = thread_count().context("counting this process's threads")?;
    if threads != 1 {
        bail!("cannot fork into the background: {threads} threads are running (run in the foreground)");
    }
    let log = open_log(log_file)?;
    let (rd, wr) = pipe().context("creating the start-up pipe")?;
    // Flush what the parent may have buffered, so the child does not
    // write it again.
    let _ = io::stdout().flush();
    // SAFETY: `fork` is unsafe whatever the crate because only
    // async-signal-safe code may run in the child of a multi-threaded
    // process (another thread may hold a lock, e.g. the allocator's, that
    // nothing in the child would release). This process is single-threaded:
    // `thread_count` said so above, and nothing since started a thread, so
    // the child may run arbitrary code.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(rd);
            let mut r = Reporter { pipe: Some(wr) };
            if let Err(e) = become_daemon(&log) {
                r.failed(&format!("detaching from the terminal: {e}"));
                // SAFETY: `_exit` ends the child at once, without running the
                // parent's destructors or atexit handlers (`nix` and `rustix`
                // offer no safe `_exit`; `std::process::exit` would run them).
                unsafe { libc::_exit(1) };
            }
            return Ok(Role::Daemon(r));
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => return Err(io::Error::from(e)).context("fork"),
    };
    drop(wr);
    Ok(Role::Parent(wait_report(rd, child, log_file)))
}

/// The child's exit status, waiting at most `timeout`; `None` if it has
/// not exited by then.
fn wait_exit(pid: Pid, timeout: Duration) -> Option<WaitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            Ok(status) => return Some(status),
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn describe_exit(status: Option<WaitStatus>) -> String {
    match status {
        Some(WaitStatus::Exited(_, code)) => format!("exited with status {code}"),
        Some(WaitStatus::Signaled(_, sig, _)) => {
            format!("was killed by signal {}", sig as libc::c_int)
        }
        Some(_) => "stopped".into(),
        None => "did not exit".into(),
    }
}

/// The parent's side: reads the report (bounded in time and size).
fn wait_report(mut rd: File, pid: Pid, log_file: &Path) -> Outcome {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut buf = Vec::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        let mut fds = [PollFd::new(&rd, PollFlags::IN)];
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        let mut chunk = [0u8; 4096];
        match rd.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_REPORT {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&buf);
    if text == "READY\n" {
        return Outcome::Ready {
            pid: pid.as_raw() as u32,
        };
    }
    let log = log_file.display();
    if let Some(err) = text.strip_prefix("ERROR\n") {
        let status = wait_exit(pid, EXIT_TIMEOUT);
        let mut message = err.trim_end().to_string();
        if status.is_none() {
            message.push_str(&format!(
                " (and the daemon, pid {pid}, did not exit; see {log})"
            ));
        }
        return Outcome::Failed { message };
    }
    if timed_out {
        // Our own child; it stops cleanly on SIGTERM once its loop runs.
        let _ = kill(pid, Signal::SIGTERM);
        let status = wait_exit(pid, EXIT_TIMEOUT);
        return Outcome::Failed {
            message: format!(
                "the daemon (pid {pid}) did not report that it was up within {} s; sent it \
                 SIGTERM, it {}; see {log}",
                START_TIMEOUT.as_secs(),
                describe_exit(status)
            ),
        };
    }
    let status = wait_exit(pid, EXIT_TIMEOUT);
    Outcome::Failed {
        message: format!(
            "the daemon (pid {pid}) {} during start-up without a report; see {log}",
            describe_exit(status)
        ),
    }
}

/// A pid file holding this process's id, removed on drop if it still
/// holds it.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    pid: u32,
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `pid` is a live (not zombie) process running the same program
/// as this one (by `/proc/PID/comm`).
fn is_running_espgate(pid: u32) -> bool {
    let comm = |p: &str| std::fs::read(format!("/proc/{p}/comm")).ok();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesised command name.
    let zombie = stat
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'));
    !zombie && comm(&pid.to_string()).is_some() && comm(&pid.to_string()) == comm("self")
}

impl PidFile {
    /// Fails if `path` names a running espgate process other than this
    /// one; a stale file is left to be replaced.
    pub fn check(path: &Path) -> Result<()> {
        if let Some(pid) = read_pid(path) {
            if pid != std::process::id() && is_running_espgate(pid) {
                bail!(
                    "pid file {} belongs to espgate process {pid}, which is running; stop it \
                     (kill {pid}) or use another --pid-file",
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// Writes this process's id to `path` (mode 0644, atomically through
    /// a temporary file), creating its directory (0755) if needed.
    pub fn create(path: &Path) -> Result<PidFile> {
        let pid = std::process::id();
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        let name = path
            .file_name()
            .with_context(|| format!("pid file {} has no file name", path.display()))?;
        let tmp = dir.join(format!(".{}.{pid}.tmp", name.to_string_lossy()));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .open(&tmp)?;
            f.write_all(format!("{pid}\n").as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing pid file {}", path.display()));
        }
        Ok(PidFile {
            path: path.to_path_buf(),
            pid,
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        if read_pid(&self.path) == Some(self.pid) {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!("removing pid file {}: {e}", self.path.display());
            }
        }
    }
}

/// Sends `state` (e.g. `"READY=1"`) to systemd's notification socket, if
/// `$NOTIFY_SOCKET` names one (a path, or `@name` in the abstract
/// namespace). `Ok(false)`: not started by systemd with `Type=notify`.
pub fn sd_notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(target) => notify_to(&target, state).map(|()| true),
        None => Ok(false),
    }
}

/// Sends `state` to the notification socket `target`.
fn notify_to(target: &std::ffi::OsStr, state: &str) -> io::Result<()> {
    use std::os::unix::net::UnixDatagram;
    let bytes = target.as_bytes();
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else if bytes.starts_with(b"/") {
        sock.send_to(state.as_bytes(), Path::new(target))?;
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET={target:?} is neither a path nor @abstract"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir() -> PathBuf {
        espgate_testkit::temp_dir("daemon-test")
    }

    #[test]
    fn defaults() {
        assert_eq!(
            default_pid_file(Path::new("/run/espgate/espgate.sock")),
            Path::new("/run/espgate/espgate.pid")
        );
        assert_eq!(
            default_pid_file(Path::new("/x/ctl")),
            Path::new("/x/ctl.pid")
        );
        assert_eq!(
            default_log_file(Path::new("/etc/espgate/site-b.toml")),
            Path::new("/var/log/espgate/site-b.log")
        );
    }

    #[test]
    fn pid_file_lifecycle() {
        let d = temp_dir();
        let p = d.join("sub").join("gw.pid");
        PidFile::check(&p).unwrap();
        let f = PidFile::create(&p).unwrap();
        assert_eq!(read_pid(&p), Some(std::process::id()));
        // Our own pid is not "another running daemon".
        PidFile::check(&p).unwrap();
        drop(f);
        assert!(!p.exists());
        // A pid file of a live process of this program is refused (this
        // test binary's parent is not; pid 1 is not espgate either).
        std::fs::write(&p, "1\n").unwrap();
        PidFile::check(&p).unwrap();
        // One that was replaced by someone else is not removed.
        let f = PidFile::create(&p).unwrap();
        std::fs::write(&p, "12345678\n").unwrap();
        drop(f);
        assert!(p.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn notify_socket() {
        use std::os::unix::net::UnixDatagram;
        let d = temp_dir();
        let path = d.join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        notify_to(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        // The abstract namespace, as systemd usually passes it.
        let name = format!("espgate-test-{}", std::process::id());
        let abs = {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            UnixDatagram::bind_addr(&a).unwrap()
        };
        abs.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        notify_to(
            std::ffi::OsStr::new(&format!("@{name}")),
            "READY=1\nMAINPID=7",
        )
        .unwrap();
        let n = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nMAINPID=7");
        assert!(notify_to(std::ffi::OsStr::new("relative"), "READY=1").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
