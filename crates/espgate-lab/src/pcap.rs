//! `espgate pcap encrypt|decrypt`: apply SAs to captured packets.

use crate::capture::{read_capture, RawIpWriter};
use anyhow::{bail, Context, Result};
use espgate_core::sa::{spec, Classifier, Sa, SaConfig};
use espgate_core::sad::{InboundResult, SaId, Sad};
use espgate_core::{DropReason, PacketBuf};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// Parses `--sa` specs into configs; errors say which `--sa` was wrong.
pub fn parse_specs(specs: &[String]) -> Result<Vec<SaConfig>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| spec::parse(s).map_err(|e| anyhow::anyhow!("--sa #{}: {e}", i + 1)))
        .collect()
}

fn install(cfg: SaConfig, which: usize) -> Result<Sa> {
    Sa::new(cfg, Duration::ZERO).map_err(|e| anyhow::anyhow!("--sa #{which}: {e}"))
}

/// Totals printed at the end of a run.
#[derive(Debug, Default)]
pub struct Summary {
    /// Frames read.
    pub frames: usize,
    /// Packets written.
    pub written: usize,
    /// Failures by reason.
    pub failed: BTreeMap<&'static str, usize>,
    /// Packets that were not for us (not IPsec, IKE, keepalives, dummies, non-IP frames).
    pub skipped: BTreeMap<String, usize>,
}

impl Summary {
    fn fail(&mut self, d: DropReason) {
        *self.failed.entry(d.as_str()).or_default() += 1;
    }
    fn skip(&mut self, why: &str) {
        *self.skipped.entry(why.to_string()).or_default() += 1;
    }
    /// Number of failed packets.
    pub fn failures(&self) -> usize {
        self.failed.values().sum()
    }
    /// One-paragraph report.
    pub fn render(&self, verb: &str) -> String {
        let mut s = format!("{} frames read, {} {verb}", self.frames, self.written);
        if !self.failed.is_empty() {
            let f: Vec<String> = self
                .failed
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            s += &format!(", {} failed ({})", self.failures(), f.join(", "));
        }
        if !self.skipped.is_empty() {
            let f: Vec<String> = self
                .skipped
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            s += &format!(
                ", {} skipped ({})",
                self.skipped.values().sum::<usize>(),
                f.join(", ")
            );
        }
        s
    }
}

/// Options shared by both directions.
pub struct Options<'a> {
    /// Input capture.
    pub input: &'a Path,
    /// Output capture (raw IP).
    pub output: &'a Path,
    /// UDP port that carries ESP.
    pub nat_t_port: u16,
    /// Copy packets that are not IPsec (decrypt) to the output unchanged.
    pub passthrough: bool,
    /// Print one line per packet problem.
    pub quiet: bool,
}

/// Decrypts every ESP/AH packet whose SPI matches one of `cfgs`.
pub fn decrypt(cfgs: Vec<SaConfig>, opt: &Options<'_>, log: &mut dyn Write) -> Result<Summary> {
    let mut sad = Sad::new();
    // Q-ESP on the number its SAs name (253 unless `ipproto=` says).
    let qesp = cfgs
        .iter()
        .find(|c| c.protocol == espgate_core::sa::Protocol::Qesp)
        .map_or(espgate_core::wire::qesp::DEFAULT_IP_PROTOCOL, |c| {
            c.ip_protocol
        });
    for (i, c) in cfgs.into_iter().enumerate() {
        sad.insert(install(c, i + 1)?)
            .map_err(|e| anyhow::anyhow!("--sa #{}: {e}", i + 1))?;
    }
    let cap = read_capture(opt.input)?;
    let mut out = RawIpWriter::create(opt.output)?;
    let mut sum = Summary {
        frames: cap.packets.len() + cap.skipped.len(),
        ..Default::default()
    };
    for (frame, why) in &cap.skipped {
        sum.skip("not IP");
        if !opt.quiet {
            writeln!(log, "frame {frame}: skipped: {why}")?;
        }
    }
    let mut buf = PacketBuf::with_capacity(9216);
    let classifier = Classifier::new().udp_port(opt.nat_t_port).qesp(qesp);
    for (frame, p) in &cap.packets {
        buf.load(&p.ip);
        match sad.decapsulate(&mut buf, &classifier, Duration::ZERO) {
            Ok(InboundResult::Packet(_)) => {
                out.write(p.ts_sec, p.ts_nsec, buf.as_slice())?;
                sum.written += 1;
            }
            Ok(InboundResult::Dummy(_)) => sum.skip("dummy (next header 59)"),
            Ok(InboundResult::Ike) => sum.skip("IKE"),
            Ok(InboundResult::Keepalive) => sum.skip("NAT keepalive"),
            Err(e) if e.reason == DropReason::NotIpsec => {
                sum.skip("not IPsec");
                if opt.passthrough {
                    out.write(p.ts_sec, p.ts_nsec, &p.ip)?;
                    sum.written += 1;
                }
            }
            Err(e) => {
                sum.fail(e.reason);
                if !opt.quiet {
                    let spi = e.spi.map(|s| format!(" SPI {s:#010x}")).unwrap_or_default();
                    writeln!(log, "frame {frame}:{spi}: {}", describe(e.reason))?;
                }
            }
        }
    }
    out.finish()?;
    Ok(sum)
}

/// Encrypts every IP packet with the SAs in order (one SA, or a bundle
/// such as ESP then AH).
pub fn encrypt(cfgs: Vec<SaConfig>, opt: &Options<'_>, log: &mut dyn Write) -> Result<Summary> {
    if cfgs.is_empty() {
        bail!("encrypt needs at least one --sa");
    }
    let mut sad = Sad::new();
    let mut ids: Vec<SaId> = Vec::new();
    for (i, c) in cfgs.into_iter().enumerate() {
        let sa = install(c, i + 1)?;
        sa.config()
            .validate_outbound()
            .map_err(|e| anyhow::anyhow!("--sa #{}: {e}", i + 1))?;
        let id = sad
            .insert(sa)
            .map_err(|e| anyhow::anyhow!("--sa #{}: {e}", i + 1))?;
        ids.push(id);
    }
    let cap = read_capture(opt.input)?;
    let mut out = RawIpWriter::create(opt.output)?;
    let mut sum = Summary {
        frames: cap.packets.len() + cap.skipped.len(),
        ..Default::default()
    };
    for (frame, why) in &cap.skipped {
        sum.skip("not IP");
        if !opt.quiet {
            writeln!(log, "frame {frame}: skipped: {why}")?;
        }
    }
    let mut buf = PacketBuf::with_capacity(9216);
    for (frame, p) in &cap.packets {
        buf.load(&p.ip);
        match sad.encapsulate(&ids, &mut buf, Duration::ZERO) {
            Ok(()) => {
                out.write(p.ts_sec, p.ts_nsec, buf.as_slice())?;
                sum.written += 1;
            }
            Err(d) => {
                sum.fail(d);
                if !opt.quiet {
                    writeln!(log, "frame {frame}: {}", describe(d))?;
                }
            }
        }
    }
    out.finish()?;
    Ok(sum)
}

/// A sentence for a drop reason, for people reading a terminal.
pub fn describe(d: DropReason) -> String {
    let s = match d {
        DropReason::UnknownSpi => "no --sa has this SPI",
        DropReason::Integrity => "ICV check failed (wrong key, wrong suite, or tampered packet)",
        DropReason::Replay => {
            "sequence number already seen or left of the replay window (try seq=)"
        }
        DropReason::BadPadding => "padding invalid after decryption (wrong key or suite?)",
        DropReason::BadNextHeader => "next header does not fit the SA mode (tunnel vs transport?)",
        DropReason::SelectorMismatch => "inner packet outside the SA's traffic selectors",
        DropReason::QespPortMismatch => {
            "the clear ports or TLP of the Q-ESP header are not the decrypted packet's"
        }
        DropReason::Fragment => {
            "IP fragment (reassemble first; transport mode needs whole datagrams)"
        }
        DropReason::SeqExhausted => "sequence numbers used up (use esn=yes or a lower seq=)",
        DropReason::SeqNotReserved => "sequence number above the reserved ceiling",
        DropReason::BadLength => "truncated or inconsistent lengths",
        _ => "",
    };
    if s.is_empty() {
        d.as_str().to_string()
    } else {
        format!("{} ({s})", d.as_str())
    }
}

/// Reads the input only to say early whether it exists (clearer than a
/// parser error).
pub fn check_input(p: &Path) -> Result<()> {
    std::fs::metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
    Ok(())
}
