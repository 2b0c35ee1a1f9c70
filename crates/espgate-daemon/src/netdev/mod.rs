//! The gateway's device layer on Linux: the TUN device the clear-text side
//! reads and writes ([`tun`]), and the links, addresses, routes and
//! policy-routing rules around it, configured over rtnetlink with every
//! change journalled so it can be undone ([`netlink`]).
//!
//! ```no_run
//! use espgate_daemon::netdev::{NetChanges, RouteSpec, RuleSpec, IfAddr, Family, Tun};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tun = Tun::builder("espgate0").multi_queue(2).open()?;
//! let mut net = NetChanges::new()?;
//! net.set_mtu("espgate0", 1400)?;
//! net.add_address(&IfAddr::new("espgate0", "10.1.0.1".parse()?, 24)?)?;
//! net.set_up("espgate0")?;
//! net.add_route(&RouteSpec::new("10.2.0.0/16".parse()?, "espgate0").table(51820))?;
//! net.add_rule(&RuleSpec::not_fwmark_lookup(Family::V4, 51820, 51820).priority(32000))?;
//! net.add_rule(&RuleSpec::suppress_main(Family::V4).priority(31999))?;
//! // ... run the gateway ...
//! net.undo()?; // or just drop `net`: rules, routes, addresses, MTU go back
//! drop(tun);   // the TUN device disappears with its last queue
//! # Ok(()) }
//! ```
//!
//! # Crate choices
//!
//! **TUN: raw ioctls via `libc`, not `tun-rs`.** `tun-rs` 2.8 (maintained,
//! Linux multi-queue via `try_clone`) was evaluated. Its offload support is
//! a single `offload(bool)` that always asks for `CSUM|TSO4|TSO6` plus
//! `USO4|USO6` if accepted, and couples that to its own GSO/GRO splitting
//! of reads and writes; there is no way to ask for a chosen set of
//! `TUN_F_*` flags and learn which the kernel took, which the data plane
//! needs. It also pulls in interface-address management (`netconfig-rs`)
//! that would duplicate the netlink side. What we need is two ioctls
//! (`TUNSETIFF`, `TUNSETOFFLOAD`), whose constants and `struct ifreq` are
//! all in `libc`, so [`tun`] does them directly in a few commented
//! `unsafe` blocks (neither `rustix` nor `nix` has them); reads, writes
//! and `fcntl` for `O_NONBLOCK` go through `rustix`.
//!
//! **Netlink: `netlink-packet-route` + `netlink-packet-core` +
//! `netlink-sys`** (the rust-netlink crates, synchronous socket, no
//! tokio). They give typed link/address/route/rule messages and a plain
//! blocking socket; the request/ack loop and the extended-ack error
//! strings are done in [`netlink`]. `rtnetlink` (the async layer on top)
//! was not used: it requires tokio.

pub mod netlink;
pub mod tun;

#[cfg(test)]
mod tests;

pub use netlink::{
    Family, IfAddr, LinkInfo, NetChanges, Netlink, RouteSpec, RuleSpec, UndoError, TABLE_MAIN,
};
pub use tun::{Offloads, Tun, TunBuilder, TunQueue, VirtioNetHdr, VNET_HDR_LEN};

use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use std::fmt;
use std::io;
use std::os::fd::AsFd;

/// A failed device or network-configuration operation: what was being done
/// (e.g. `adding route 10.2.0.0/16 via espgate0`), the OS error, and the
/// kernel's extended-ack message when it gave one.
///
/// Displays as `adding route 10.2.0.0/16 via espgate0: File exists (os error 17)`.
#[derive(Debug)]
pub struct NetError {
    action: String,
    source: io::Error,
    detail: Option<String>,
}

impl NetError {
    pub(crate) fn new(action: String, source: io::Error) -> NetError {
        NetError {
            action,
            source,
            detail: None,
        }
    }

    pub(crate) fn with_detail(mut self, detail: Option<String>) -> NetError {
        self.detail = detail;
        self
    }

    /// What was being attempted, e.g. `setting MTU 1400 on espgate0`.
    pub fn action(&self) -> &str {
        &self.action
    }

    /// The underlying OS error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }

    /// The errno, if the error came from the kernel.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// The kernel's extended-ack message (`NLMSGERR_ATTR_MSG`), if any.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// True for errors meaning the object was already absent (`ENOENT`,
    /// `ESRCH`, `ENODEV`, `EADDRNOTAVAIL`): what undo treats as done.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENOENT | libc::ESRCH | libc::ENODEV | libc::EADDRNOTAVAIL)
        )
    }

    /// True for `EEXIST`.
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.action, self.source)?;
        if let Some(d) = &self.detail {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Sets `SO_MARK` (the fwmark policy rules match on) on a socket, so that
/// e.g. the gateway's own ESP/UDP packets bypass a `not fwmark` rule.
/// Needs `CAP_NET_ADMIN`. (Through `nix`: `rustix` 1.1 has no `SO_MARK`.)
pub fn set_socket_mark<S: AsFd>(sock: &S, mark: u32) -> io::Result<()> {
    setsockopt(sock, sockopt::Mark, &mark).map_err(crate::sys::context("setting SO_MARK"))
}

/// Reads `SO_MARK` back from a socket.
pub fn socket_mark<S: AsFd>(sock: &S) -> io::Result<u32> {
    Ok(getsockopt(sock, sockopt::Mark)?)
}
