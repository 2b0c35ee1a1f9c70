//! SA changes applied to every worker's engine at once (`sa add`, `sa del`,
//! IKE installs with several data-plane workers), keeping the invariants
//! of [`Engine::for_workers`]: outbound copies share engine 0's counter and
//! lease, each inbound SA lives only in the engine of the worker its SPI
//! is steered to.

use super::{Engine, NegotiatedSa, SaChange};
use crate::sa::Protocol;
use std::net::SocketAddr;
use std::time::Duration;

/// After an SA was installed in every engine: links the outbound copies to
/// engine 0's, or keeps the inbound one only where it is steered.
fn settle(
    engines: &mut [&mut Engine],
    conn: &str,
    outbound: bool,
    sa: (Protocol, u32),
) -> Result<(), String> {
    let n = engines.len();
    if n < 2 {
        return Ok(());
    }
    if outbound {
        let (first, rest) = engines.split_at_mut(1);
        let id = first[0]
            .find_sa(conn, true, sa.0, sa.1)
            .ok_or_else(|| format!("the new outbound SA {:#010x} is missing in worker 0", sa.1))?;
        first[0].link_workers(rest, Some(id))
    } else {
        for (k, e) in engines.iter_mut().enumerate() {
            e.keep_own_inbound(k, n);
        }
        Ok(())
    }
}

/// Applies `change` to engine 0 — whose answer is the answer — then to the
/// others, then [`settle`]s the copies.
fn apply_all(
    engines: &mut [&mut Engine],
    conn: &str,
    outbound: bool,
    mut change: impl FnMut(&mut Engine) -> Result<SaChange, String>,
) -> Result<SaChange, String> {
    let Some((first, rest)) = engines.split_first_mut() else {
        return Err("no data-plane engine".into());
    };
    let answer = change(first)?;
    for e in rest.iter_mut() {
        // The same change on a copy of the same SAs cannot fail where the
        // first one passed; if it does, the engines disagree.
        change(e).map_err(|err| format!("worker engines disagree (internal error): {err}"))?;
    }
    if let Some(sa) = answer.installed {
        settle(engines, conn, outbound, sa)?;
    }
    Ok(answer)
}

/// [`Engine::add_sa`] on every engine.
pub fn add_sa_all(
    engines: &mut [&mut Engine],
    conn: &str,
    outbound: bool,
    spec: &str,
    now: Duration,
) -> Result<SaChange, String> {
    apply_all(engines, conn, outbound, |e| {
        e.add_sa(conn, outbound, spec, now)
    })
}

/// [`Engine::install_negotiated`] on every engine.
pub fn install_negotiated_all(
    engines: &mut [&mut Engine],
    sa: &NegotiatedSa<'_>,
    now: Duration,
) -> Result<SaChange, String> {
    apply_all(engines, sa.conn, sa.outbound, |e| {
        e.install_negotiated(sa, now)
    })
}

/// [`Engine::set_peer`] on every engine (each holds its copy of the
/// outbound SAs); how many outbound SAs changed in the first.
pub fn set_peer_all(
    engines: &mut [&mut Engine],
    conn: &str,
    peer: SocketAddr,
) -> Result<usize, String> {
    let mut first = None;
    for e in engines.iter_mut() {
        let n = e.set_peer(conn, peer)?;
        first.get_or_insert(n);
    }
    Ok(first.unwrap_or(0))
}

/// [`Engine::del_sa`] wherever the SA is: an outbound SA is in every
/// engine, an inbound one in one only. The answer is the first engine's
/// that held it; an error only if none did.
pub fn del_sa_all(
    engines: &mut [&mut Engine],
    spi: u32,
    protocol: Option<Protocol>,
    outbound: Option<bool>,
    conn: Option<&str>,
) -> Result<SaChange, String> {
    let mut first_ok = None;
    let mut first_err = None;
    for e in engines.iter_mut() {
        match e.del_sa(spi, protocol, outbound, conn) {
            Ok(c) => {
                first_ok.get_or_insert(c);
            }
            Err(err) => {
                first_err.get_or_insert(err);
            }
        }
    }
    match (first_ok, first_err) {
        (Some(c), _) => Ok(c),
        (None, Some(e)) => Err(e),
        (None, None) => Err("no data-plane engine".into()),
    }
}
