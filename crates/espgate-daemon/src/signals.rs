//! SIGINT, SIGTERM and SIGHUP as a pollable descriptor (`signalfd`).
//!
//! The signals are blocked for the calling thread (and threads it starts
//! later), so they stay pending until the loop reads them from the
//! descriptor: a signal that arrives during setup stops the daemon as soon
//! as the loop starts, through the same clean shutdown.
//!
//! Through `nix` (`SigSet::thread_block`, `SignalFd`): `rustix` 1.1 has no
//! signalfd or signal mask calls.

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

/// The signals that stop the daemon.
pub const STOP_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// A non-blocking signalfd for [`STOP_SIGNALS`].
#[derive(Debug)]
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks [`STOP_SIGNALS`] in this thread and opens the descriptor.
    /// Call before starting any thread.
    pub fn block() -> io::Result<Signals> {
        let mut set = SigSet::empty();
        for s in STOP_SIGNALS {
            set.add(s);
        }
        set.thread_block().map_err(crate::sys::context(
            "blocking the signals (pthread_sigmask)",
        ))?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(crate::sys::context("creating the signalfd"))?;
        Ok(Signals { fd })
    }

    /// The descriptor (readable when a signal is pending).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The number of the next pending signal, if any.
    pub fn next(&self) -> Option<libc::c_int> {
        match self.fd.read_signal() {
            Ok(Some(info)) => libc::c_int::try_from(info.ssi_signo).ok(),
            _ => None,
        }
    }
}

impl AsFd for Signals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The signal's name, for the log.
pub fn name(sig: libc::c_int) -> &'static str {
    match Signal::try_from(sig) {
        Ok(s) if STOP_SIGNALS.contains(&s) => s.as_str(),
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(libc::SIGINT), "SIGINT");
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(libc::SIGHUP), "SIGHUP");
        assert_eq!(name(libc::SIGUSR1), "signal");
        assert_eq!(name(-1), "signal");
    }

    /// A stop signal sent to this (test) thread, where it is blocked, is
    /// read from the descriptor instead of being delivered.
    #[test]
    fn blocked_signal_is_read_from_the_descriptor() {
        let s = Signals::block().unwrap();
        assert_eq!(s.next(), None);
        nix::sys::signal::raise(Signal::SIGHUP).unwrap();
        assert_eq!(s.next(), Some(libc::SIGHUP));
        assert_eq!(s.next(), None);
    }
}
