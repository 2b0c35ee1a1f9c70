//! SIGINT, SIGTERM and SIGHUP as a pollable descriptor (`signalfd`).
//!
//! The signals are blocked for the calling thread (and threads it starts
//! later), so they stay pending until the loop reads them from the
//! descriptor: a signal that arrives during setup stops the daemon as soon
//! as the loop starts, through the same clean shutdown.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The signals that stop the daemon.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// A non-blocking signalfd for [`STOP_SIGNALS`].
#[derive(Debug)]
pub struct Signals {
    fd: OwnedFd,
}

impl Signals {
    /// Blocks [`STOP_SIGNALS`] in this thread and opens the descriptor.
    /// Call before starting any thread.
    pub fn block() -> io::Result<Signals> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset before
        // use; sigaddset/pthread_sigmask/signalfd only read and write it.
        unsafe {
            let mut set: libc::sigset_t = zeroed();
            libc::sigemptyset(&mut set);
            for s in STOP_SIGNALS {
                libc::sigaddset(&mut set, s);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Signals {
                fd: OwnedFd::from_raw_fd(fd),
            })
        }
    }

    /// The descriptor (readable when a signal is pending).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The next pending signal, if any.
    pub fn next(&self) -> Option<libc::c_int> {
        // SAFETY: plain data; the kernel writes one whole record or nothing.
        let mut info: libc::signalfd_siginfo = unsafe { zeroed() };
        // SAFETY: reads at most size_of(info) bytes into the live `info`.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size_of::<libc::signalfd_siginfo>(),
            )
        };
        (n == size_of::<libc::signalfd_siginfo>() as isize).then_some(info.ssi_signo as libc::c_int)
    }
}

impl AsFd for Signals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The signal's name, for the log.
pub fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
