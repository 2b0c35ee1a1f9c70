//! Packet capture input and output for `espgate pcap encrypt|decrypt`.
//!
//! [`read_capture`] loads a classic pcap (either byte order, microsecond or
//! nanosecond magic) or pcapng file and strips the link-layer header of every
//! frame, yielding bare IPv4/IPv6 packets. Frames that do not carry IP (ARP,
//! other ethertypes, truncated headers, ...) are not fatal: they are listed in
//! [`CaptureReport::skipped`] together with a human-readable reason.
//!
//! [`RawIpWriter`] writes bare IP packets to a classic pcap file with
//! `LINKTYPE_RAW` (101) and nanosecond timestamps, which tshark, tcpdump and
//! Scapy all read.
//!
//! Classic pcap record framing is handled by the `pcap-file` crate. pcapng is
//! parsed here because `pcap-file` 2.0 ignores `if_tsresol` when decoding
//! timestamps and rejects some valid interface options (e.g. `if_tzone`).

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Cursor, ErrorKind, Read};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use pcap_file::pcap::{PcapHeader, PcapReader, PcapWriter, RawPcapPacket};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

/// One IP packet extracted from a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedPacket {
    /// Capture timestamp, whole seconds since the Unix epoch.
    pub ts_sec: u64,
    /// Sub-second part of the capture timestamp, in nanoseconds (`< 1_000_000_000`).
    pub ts_nsec: u32,
    /// The IP packet (IPv4 or IPv6, starting at the version nibble) with the
    /// link-layer header removed. Link-layer trailers (Ethernet padding, FCS)
    /// are trimmed using the IP header's length field.
    pub ip: Vec<u8>,
}

/// Result of reading a capture file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureReport {
    /// Extracted IP packets, each with its 1-based frame number in the capture.
    pub packets: Vec<(usize, CapturedPacket)>,
    /// Frames that were not used, each with its 1-based frame number and the
    /// reason (not IP, truncated, ...). An incomplete record at the end of a
    /// cut-short file is reported here too, after which reading stops.
    pub skipped: Vec<(usize, String)>,
}

impl CaptureReport {
    /// Strips the link layer from `frame` and records either the IP packet or
    /// the reason it was skipped.
    fn record(&mut self, frame_no: usize, link: LinkType, ts: (u64, u32), frame: &[u8]) {
        match link.decapsulate(frame) {
            Ok(ip) => self.packets.push((
                frame_no,
                CapturedPacket {
                    ts_sec: ts.0,
                    ts_nsec: ts.1,
                    ip: ip.to_vec(),
                },
            )),
            Err(reason) => self.skipped.push((frame_no, reason)),
        }
    }
}

/// Reads a classic pcap or pcapng file and extracts the IP packets it contains.
///
/// The format is detected from the magic bytes. Supported link types are
/// Ethernet (1, with 802.1Q/802.1ad VLAN tags), raw IP (101 and 12), IPv4
/// (228), IPv6 (229), Linux cooked capture v1 (113) and v2 (276), and BSD
/// loopback (0 and 108).
///
/// # Errors
///
/// Frames are numbered from 1 in file order, counting every packet record
/// (for pcapng: Enhanced, Simple and obsolete Packet Blocks). A frame whose IP
/// packet was cut short by the snapshot length is skipped rather than
/// returned incomplete. Simple Packet Blocks carry no timestamp; they are
/// reported with time 0.
///
/// # Errors
///
/// Fails if the file cannot be read, is neither pcap nor pcapng, is corrupt
/// beyond a truncated final record, or uses an unsupported link type for a
/// whole file (pcap) or for an interface that has packets (pcapng). Error
/// messages start with the file name.
pub fn read_capture(path: &Path) -> Result<CaptureReport> {
    let file = File::open(path)
        .map_err(|e| anyhow!("{}: cannot open capture file: {e}", path.display()))?;
    read_from(BufReader::new(file), path)
}

/// Like [`read_capture`], from bytes in memory (used by the fuzz target).
///
/// # Errors
///
/// As [`read_capture`], with `<memory>` as the file name.
pub fn read_capture_bytes(data: &[u8]) -> Result<CaptureReport> {
    read_from(Cursor::new(data), Path::new("<memory>"))
}

/// Format detection and dispatch; `name` is only used in error messages.
fn read_from<R: Read>(mut reader: R, name: &Path) -> Result<CaptureReport> {
    let mut magic = [0u8; 4];
    let got = read_full(&mut reader, &mut magic).map_err(|e| io_error(name, &e))?;
    if got < magic.len() {
        bail!(
            "{}: not a pcap or pcapng capture file (only {got} bytes long)",
            name.display()
        );
    }
    let reader = Cursor::new(magic).chain(reader);
    match magic {
        PCAP_MAGIC_BE_US | PCAP_MAGIC_LE_US | PCAP_MAGIC_BE_NS | PCAP_MAGIC_LE_NS => {
            read_pcap(reader, name)
        }
        PCAPNG_SHB_MAGIC => read_pcapng(reader, name),
        _ => bail!(
            "{}: not a pcap or pcapng capture file (unrecognised magic bytes {})",
            name.display(),
            hex::encode(magic)
        ),
    }
}

// ---------------------------------------------------------------------------
// Link layer
// ---------------------------------------------------------------------------

const LINKTYPE_NULL: u32 = 0;
const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW_BSD: u32 = 12;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LOOP: u32 = 108;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_IPV4: u32 = 228;
const LINKTYPE_IPV6: u32 = 229;
const LINKTYPE_LINUX_SLL2: u32 = 276;

/// The classic pcap link-type field carries FCS information in its upper
/// bits; libpcap masks them off the same way (`LT_LINKTYPE`).
const PCAP_LINKTYPE_MASK: u32 = 0x03FF_FFFF;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_QINQ: u16 = 0x88A8;
const ETHERTYPE_QINQ_OLD: u16 = 0x9100;

/// A supported link-layer header type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkType {
    /// BSD loopback: 4-byte address family header (`LINKTYPE_NULL`, `LINKTYPE_LOOP`).
    Loopback,
    /// Ethernet II, possibly with VLAN tags.
    Ethernet,
    /// Bare IPv4 or IPv6.
    Raw,
    /// Bare IPv4 only.
    Ipv4,
    /// Bare IPv6 only.
    Ipv6,
    /// Linux cooked capture v1, 16-byte header.
    LinuxSll,
    /// Linux cooked capture v2, 20-byte header.
    LinuxSll2,
}

impl LinkType {
    fn from_number(linktype: u32) -> Option<Self> {
        Some(match linktype {
            LINKTYPE_NULL | LINKTYPE_LOOP => Self::Loopback,
            LINKTYPE_ETHERNET => Self::Ethernet,
            LINKTYPE_RAW | LINKTYPE_RAW_BSD => Self::Raw,
            LINKTYPE_IPV4 => Self::Ipv4,
            LINKTYPE_IPV6 => Self::Ipv6,
            LINKTYPE_LINUX_SLL => Self::LinuxSll,
            LINKTYPE_LINUX_SLL2 => Self::LinuxSll2,
            _ => return None,
        })
    }

    /// Returns the IP packet inside `frame`, or why there is none.
    fn decapsulate(self, frame: &[u8]) -> Result<&[u8], String> {
        match self {
            Self::Raw => ip_packet(frame, None),
            Self::Ipv4 => ip_packet(frame, Some(4)),
            Self::Ipv6 => ip_packet(frame, Some(6)),
            Self::Ethernet => {
                let (hdr, rest) = split_header::<14>(frame, "Ethernet")?;
                by_ethertype(u16::from_be_bytes([hdr[12], hdr[13]]), rest)
            }
            Self::LinuxSll => {
                let (hdr, rest) = split_header::<16>(frame, "Linux cooked (SLL)")?;
                by_ethertype(u16::from_be_bytes([hdr[14], hdr[15]]), rest)
            }
            Self::LinuxSll2 => {
                let (hdr, rest) = split_header::<20>(frame, "Linux cooked v2 (SLL2)")?;
                by_ethertype(u16::from_be_bytes([hdr[0], hdr[1]]), rest)
            }
            Self::Loopback => {
                let (hdr, rest) = split_header::<4>(frame, "loopback")?;
                // The family is in the writer's host byte order for
                // LINKTYPE_NULL and big-endian for LINKTYPE_LOOP; accept both.
                let family = match u32::from_be_bytes(*hdr) {
                    small @ 0..=0xFFFF => small,
                    _ => u32::from_le_bytes(*hdr),
                };
                match family {
                    2 => ip_packet(rest, Some(4)),
                    // AF_INET6 on Linux, NetBSD/OpenBSD, FreeBSD, Darwin.
                    10 | 24 | 28 | 30 => ip_packet(rest, Some(6)),
                    other => Err(format!("non-IP loopback address family {other}")),
                }
            }
        }
    }
}

/// Splits a fixed-size link-layer header off `frame`.
fn split_header<'a, const N: usize>(
    frame: &'a [u8],
    what: &str,
) -> Result<(&'a [u8; N], &'a [u8]), String> {
    frame.split_first_chunk::<N>().ok_or_else(|| {
        format!(
            "truncated {what} header: {} of {N} bytes captured",
            frame.len()
        )
    })
}

/// Follows an ethertype (through any VLAN tags) to the IP packet.
fn by_ethertype(mut ethertype: u16, mut payload: &[u8]) -> Result<&[u8], String> {
    // Every iteration consumes 4 bytes, so this terminates.
    loop {
        match ethertype {
            ETHERTYPE_IPV4 => return ip_packet(payload, Some(4)),
            ETHERTYPE_IPV6 => return ip_packet(payload, Some(6)),
            ETHERTYPE_VLAN | ETHERTYPE_QINQ | ETHERTYPE_QINQ_OLD => {
                let (tag, rest) = payload.split_first_chunk::<4>().ok_or_else(|| {
                    format!(
                        "truncated VLAN tag (ethertype {ethertype:#06x}): {} of 4 bytes captured",
                        payload.len()
                    )
                })?;
                ethertype = u16::from_be_bytes([tag[2], tag[3]]);
                payload = rest;
            }
            ETHERTYPE_ARP => return Err("ARP (ethertype 0x0806), not IP".to_owned()),
            length @ 0..=0x05FF => {
                return Err(format!(
                    "IEEE 802.3/LLC frame (type/length field {length:#06x}), not IP"
                ))
            }
            other => return Err(format!("non-IP ethertype {other:#06x}")),
        }
    }
}

/// Validates that `data` starts with an IP header (of version `expect`, if
/// given) and returns exactly the IP packet, trimming link-layer trailers.
fn ip_packet(data: &[u8], expect: Option<u8>) -> Result<&[u8], String> {
    let Some(&first) = data.first() else {
        return Err("empty packet: no IP header".to_owned());
    };
    let version = first >> 4;
    if let Some(expected) = expect {
        if version != expected {
            return Err(format!(
                "link layer says IPv{expected} but the IP version nibble is {version}"
            ));
        }
    }
    match version {
        4 => {
            let hdr = data.first_chunk::<20>().ok_or_else(|| {
                format!("truncated IPv4 header: {} of 20 bytes captured", data.len())
            })?;
            let ihl = usize::from(first & 0x0F) * 4;
            if ihl < 20 {
                return Err(format!("invalid IPv4 header length {ihl}"));
            }
            if ihl > data.len() {
                return Err(format!(
                    "truncated IPv4 header: {} of {ihl} bytes captured",
                    data.len()
                ));
            }
            let total = usize::from(u16::from_be_bytes([hdr[2], hdr[3]]));
            if total == 0 {
                // Segmentation offload: the length is filled in by the NIC.
                return Ok(data);
            }
            if total < ihl {
                return Err(format!(
                    "invalid IPv4 total length {total} (header length {ihl})"
                ));
            }
            data.get(..total).ok_or_else(|| {
                format!(
                    "IPv4 packet truncated: total length {total}, {} bytes captured",
                    data.len()
                )
            })
        }
        6 => {
            let hdr = data.first_chunk::<40>().ok_or_else(|| {
                format!("truncated IPv6 header: {} of 40 bytes captured", data.len())
            })?;
            let payload_len = usize::from(u16::from_be_bytes([hdr[4], hdr[5]]));
            if payload_len == 0 {
                // Jumbogram or segmentation offload: keep everything captured.
                return Ok(data);
            }
            let total = 40 + payload_len;
            data.get(..total).ok_or_else(|| {
                format!(
                    "IPv6 packet truncated: total length {total}, {} bytes captured",
                    data.len()
                )
            })
        }
        other => Err(format!("not an IP packet (version nibble {other})")),
    }
}

// ---------------------------------------------------------------------------
// Classic pcap
// ---------------------------------------------------------------------------

const PCAP_MAGIC_BE_US: [u8; 4] = [0xA1, 0xB2, 0xC3, 0xD4];
const PCAP_MAGIC_LE_US: [u8; 4] = [0xD4, 0xC3, 0xB2, 0xA1];
const PCAP_MAGIC_BE_NS: [u8; 4] = [0xA1, 0xB2, 0x3C, 0x4D];
const PCAP_MAGIC_LE_NS: [u8; 4] = [0x4D, 0x3C, 0xB2, 0xA1];

const NSEC_PER_SEC: u64 = 1_000_000_000;

const TRUNCATED_TAIL: &str = "incomplete record at end of file (capture cut short?); rest ignored";

fn read_pcap<R: Read>(reader: R, name: &Path) -> Result<CaptureReport> {
    let mut reader = PcapReader::new(reader).map_err(|e| match e {
        PcapError::IoError(io) if io.kind() == ErrorKind::UnexpectedEof => {
            anyhow!("{}: truncated pcap file header", name.display())
        }
        other => anyhow!(
            "{}: invalid pcap file header: {}",
            name.display(),
            pcap_error(&other)
        ),
    })?;
    let header = reader.header();
    let linktype = u32::from(header.datalink) & PCAP_LINKTYPE_MASK;
    let link = LinkType::from_number(linktype)
        .ok_or_else(|| unsupported_link_type(name, linktype, None))?;
    let frac_to_nsec = match header.ts_resolution {
        TsResolution::MicroSecond => 1_000,
        TsResolution::NanoSecond => 1,
    };

    let mut report = CaptureReport::default();
    let mut frame_no = 0usize;
    while let Some(next) = reader.next_raw_packet() {
        frame_no += 1;
        let packet = match next {
            Ok(packet) => packet,
            // The crate also reports a record larger than its 8 MB buffer
            // this way; either way nothing after it can be read.
            Err(PcapError::IoError(io)) if io.kind() == ErrorKind::UnexpectedEof => {
                report.skipped.push((frame_no, TRUNCATED_TAIL.to_owned()));
                break;
            }
            Err(e) => bail!(
                "{}: error reading frame {frame_no}: {}",
                name.display(),
                pcap_error(&e)
            ),
        };
        // Normalise out-of-range fractions instead of rejecting the frame.
        let frac_nsec = u64::from(packet.ts_frac) * frac_to_nsec;
        let ts_sec = u64::from(packet.ts_sec) + frac_nsec / NSEC_PER_SEC;
        let ts_nsec = nsec_u32(frac_nsec % NSEC_PER_SEC);
        report.record(frame_no, link, (ts_sec, ts_nsec), &packet.data);
    }
    Ok(report)
}

/// Renders a `pcap-file` error including its I/O source, if any.
fn pcap_error(e: &PcapError) -> String {
    match e {
        PcapError::IoError(io) => format!("I/O error: {io}"),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// pcapng
// ---------------------------------------------------------------------------

const PCAPNG_SHB_MAGIC: [u8; 4] = [0x0A, 0x0D, 0x0D, 0x0A];
const BLOCK_SHB: u32 = 0x0A0D_0D0A;
const BLOCK_IDB: u32 = 1;
const BLOCK_PB: u32 = 2;
const BLOCK_SPB: u32 = 3;
const BLOCK_EPB: u32 = 6;

const IDB_OPT_TSRESOL: u16 = 9;
const IDB_OPT_TSOFFSET: u16 = 14;

/// Upper bound on a single pcapng block, to reject corrupt lengths early.
const MAX_BLOCK_LEN: u32 = 64 << 20;

/// Byte order of a pcapng section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ByteOrder {
    Little,
    Big,
}

impl ByteOrder {
    fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Self::Little => u16::from_le_bytes(b),
            Self::Big => u16::from_be_bytes(b),
        }
    }

    fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Self::Little => u32::from_le_bytes(b),
            Self::Big => u32::from_be_bytes(b),
        }
    }

    fn u64(self, b: [u8; 8]) -> u64 {
        match self {
            Self::Little => u64::from_le_bytes(b),
            Self::Big => u64::from_be_bytes(b),
        }
    }
}

/// Bounds-checked sequential reader over a block body.
struct Fields<'a> {
    data: &'a [u8],
    order: ByteOrder,
}

impl<'a> Fields<'a> {
    fn new(data: &'a [u8], order: ByteOrder) -> Self {
        Self { data, order }
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.data.split_first_chunk::<N>()?;
        self.data = rest;
        Some(*head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(|b| self.order.u16(b))
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(|b| self.order.u32(b))
    }

    fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        let head = self.data.get(..len)?;
        self.data = self.data.get(len..)?;
        Some(head)
    }

    fn rest(&self) -> &'a [u8] {
        self.data
    }
}

/// A pcapng interface, from its Interface Description Block.
struct Interface {
    /// Link type number, as found in the file.
    linktype: u32,
    /// Snapshot length (0 = unlimited); needed for Simple Packet Blocks.
    snaplen: u32,
    /// Timestamp units per second (`if_tsresol`).
    units_per_sec: u128,
    /// Seconds to add to every timestamp (`if_tsoffset`).
    ts_offset: i64,
}

impl Interface {
    fn parse(body: &[u8], order: ByteOrder) -> Result<Self, String> {
        let mut fields = Fields::new(body, order);
        let (Some(linktype), Some(_reserved), Some(snaplen)) =
            (fields.u16(), fields.u16(), fields.u32())
        else {
            return Err(format!("body too short ({} bytes)", body.len()));
        };
        let mut tsresol = 6u8;
        let mut ts_offset = 0i64;
        for (code, value) in options(fields.rest(), order) {
            match code {
                IDB_OPT_TSRESOL => {
                    if let Some(&v) = value.first() {
                        tsresol = v;
                    }
                }
                IDB_OPT_TSOFFSET => {
                    if let Some(b) = value.first_chunk::<8>() {
                        // The option is a signed 64-bit number of seconds.
                        ts_offset = order.u64(*b) as i64;
                    }
                }
                _ => {}
            }
        }
        let units_per_sec = if tsresol & 0x80 != 0 {
            1u128.checked_shl(u32::from(tsresol & 0x7F))
        } else {
            10u128.checked_pow(u32::from(tsresol))
        }
        .ok_or_else(|| format!("unsupported if_tsresol {tsresol:#04x}"))?;
        Ok(Self {
            linktype: u32::from(linktype),
            snaplen,
            units_per_sec,
            ts_offset,
        })
    }

    /// Converts a raw pcapng timestamp to (seconds, nanoseconds).
    fn timestamp(&self, raw: u64) -> (u64, u32) {
        let raw = u128::from(raw);
        let secs = raw / self.units_per_sec;
        let nsec = (raw % self.units_per_sec) * u128::from(NSEC_PER_SEC) / self.units_per_sec;
        let secs = i128::try_from(secs).unwrap_or(i128::MAX) + i128::from(self.ts_offset);
        let secs = u64::try_from(secs.max(0)).unwrap_or(u64::MAX);
        (secs, u32::try_from(nsec).unwrap_or(0))
    }
}

/// Iterates over the (code, value) pairs of a pcapng option list, stopping
/// at `opt_endofopt` or at the first malformed option.
fn options(mut data: &[u8], order: ByteOrder) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let mut fields = Fields::new(data, order);
        let code = fields.u16()?;
        let len = usize::from(fields.u16()?);
        if code == 0 {
            return None;
        }
        let value = fields.bytes(len)?;
        // Values are padded to 32 bits; the final padding may be missing.
        let rest = fields.rest();
        data = rest.get(padding(len)..).unwrap_or(&[]);
        Some((code, value))
    })
}

fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// One pcapng block as read from the file.
enum BlockRead {
    Block {
        kind: u32,
        body: Vec<u8>,
        len: u32,
    },
    /// Clean end of file.
    Eof,
    /// The file ends in the middle of a block.
    Truncated,
}

/// Reads one block, switching `order` when a Section Header Block is found.
/// Errors are framing problems (without file name) or I/O errors.
fn read_block<R: Read>(reader: &mut R, order: &mut ByteOrder) -> io::Result<BlockRead> {
    let mut header = [0u8; 8];
    match read_full(reader, &mut header)? {
        0 => return Ok(BlockRead::Eof),
        8 => {}
        _ => return Ok(BlockRead::Truncated),
    }
    let [t0, t1, t2, t3, l0, l1, l2, l3] = header;
    let mut body = Vec::new();
    if [t0, t1, t2, t3] == PCAPNG_SHB_MAGIC {
        let mut bom = [0u8; 4];
        if read_full(reader, &mut bom)? < bom.len() {
            return Ok(BlockRead::Truncated);
        }
        *order = match bom {
            [0x1A, 0x2B, 0x3C, 0x4D] => ByteOrder::Big,
            [0x4D, 0x3C, 0x2B, 0x1A] => ByteOrder::Little,
            _ => {
                return Err(corrupt(format!(
                    "invalid section header byte-order magic {}",
                    hex::encode(bom)
                )))
            }
        };
        body.extend_from_slice(&bom);
    }
    let kind = order.u32([t0, t1, t2, t3]);
    let len = order.u32([l0, l1, l2, l3]);
    let min_len = if kind == BLOCK_SHB { 28 } else { 12 };
    if len < min_len || len & 3 != 0 || len > MAX_BLOCK_LEN {
        return Err(corrupt(format!(
            "invalid block length {len} (block type {kind:#010x})"
        )));
    }
    let body_len = u64::from(len - 12);
    let remaining = body_len.saturating_sub(body.len() as u64);
    reader.by_ref().take(remaining).read_to_end(&mut body)?;
    if (body.len() as u64) < body_len {
        return Ok(BlockRead::Truncated);
    }
    let mut trailer = [0u8; 4];
    if read_full(reader, &mut trailer)? < trailer.len() {
        return Ok(BlockRead::Truncated);
    }
    let trailer_len = order.u32(trailer);
    if trailer_len != len {
        return Err(corrupt(format!(
            "block length {len} does not match trailing length {trailer_len} (block type {kind:#010x})"
        )));
    }
    Ok(BlockRead::Block { kind, body, len })
}

fn corrupt(msg: String) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, msg)
}

/// A packet from an EPB, SPB or obsolete PB, before link-layer decoding.
struct NgPacket<'a> {
    interface: u32,
    /// Raw timestamp in interface units; `None` for Simple Packet Blocks.
    timestamp: Option<u64>,
    data: &'a [u8],
}

/// Parses the body of a packet block. Errors are skip reasons.
fn parse_packet_block<'a>(
    kind: u32,
    body: &'a [u8],
    order: ByteOrder,
    interfaces: &[Interface],
) -> Result<NgPacket<'a>, String> {
    let mut fields = Fields::new(body, order);
    if kind == BLOCK_SPB {
        let orig_len = fields
            .u32()
            .ok_or("malformed simple packet block: body too short")?;
        let iface = interfaces
            .first()
            .ok_or("simple packet block but no interface is defined")?;
        let mut caplen = usize::try_from(orig_len).unwrap_or(usize::MAX);
        if iface.snaplen != 0 {
            caplen = caplen.min(usize::try_from(iface.snaplen).unwrap_or(usize::MAX));
        }
        let data = fields.rest();
        return Ok(NgPacket {
            interface: 0,
            timestamp: None,
            data: data.get(..caplen).unwrap_or(data),
        });
    }
    let what = if kind == BLOCK_EPB {
        "enhanced packet block"
    } else {
        "packet block"
    };
    let interface = if kind == BLOCK_EPB {
        fields.u32()
    } else {
        // Obsolete Packet Block: 16-bit interface id, 16-bit drops count.
        fields
            .u16()
            .and_then(|id| fields.u16().map(|_drops| u32::from(id)))
    };
    let (Some(interface), Some(ts_high), Some(ts_low), Some(caplen), Some(_orig_len)) = (
        interface,
        fields.u32(),
        fields.u32(),
        fields.u32(),
        fields.u32(),
    ) else {
        return Err(format!("malformed {what}: body too short"));
    };
    let data = usize::try_from(caplen)
        .ok()
        .and_then(|len| fields.bytes(len))
        .ok_or_else(|| format!("malformed {what}: captured length {caplen} exceeds the block"))?;
    Ok(NgPacket {
        interface,
        timestamp: Some(u64::from(ts_high) << 32 | u64::from(ts_low)),
        data,
    })
}

fn read_pcapng<R: Read>(mut reader: R, name: &Path) -> Result<CaptureReport> {
    let mut order = ByteOrder::Little;
    let mut interfaces: Vec<Interface> = Vec::new();
    let mut report = CaptureReport::default();
    let mut frame_no = 0usize;
    let mut offset = 0u64;
    loop {
        let (kind, body, len) = match read_block(&mut reader, &mut order) {
            Ok(BlockRead::Block { kind, body, len }) => (kind, body, len),
            Ok(BlockRead::Eof) => break,
            Ok(BlockRead::Truncated) => {
                report
                    .skipped
                    .push((frame_no + 1, TRUNCATED_TAIL.to_owned()));
                break;
            }
            Err(e) if e.kind() == ErrorKind::InvalidData => bail!(
                "{}: corrupt pcapng block at byte offset {offset}: {e}",
                name.display()
            ),
            Err(e) => return Err(io_error(name, &e)),
        };
        let block_offset = offset;
        offset += u64::from(len);
        match kind {
            BLOCK_SHB => {
                // Body: byte-order magic, major and minor version, section length.
                let major = Fields::new(body.get(4..).unwrap_or(&[]), order).u16();
                if major != Some(1) {
                    bail!(
                        "{}: unsupported pcapng major version {} at byte offset {block_offset}",
                        name.display(),
                        major.map_or_else(|| "(missing)".to_owned(), |v| v.to_string())
                    );
                }
                interfaces.clear();
            }
            BLOCK_IDB => {
                let iface = Interface::parse(&body, order).map_err(|e| {
                    anyhow!(
                        "{}: interface {} (byte offset {block_offset}): {e}",
                        name.display(),
                        interfaces.len()
                    )
                })?;
                interfaces.push(iface);
            }
            BLOCK_EPB | BLOCK_PB | BLOCK_SPB => {
                frame_no += 1;
                let packet = match parse_packet_block(kind, &body, order, &interfaces) {
                    Ok(packet) => packet,
                    Err(reason) => {
                        report.skipped.push((frame_no, reason));
                        continue;
                    }
                };
                let Some(iface) = usize::try_from(packet.interface)
                    .ok()
                    .and_then(|i| interfaces.get(i))
                else {
                    report.skipped.push((
                        frame_no,
                        format!("packet references undefined interface {}", packet.interface),
                    ));
                    continue;
                };
                let link = LinkType::from_number(iface.linktype).ok_or_else(|| {
                    unsupported_link_type(name, iface.linktype, Some(packet.interface))
                })?;
                let ts = packet.timestamp.map_or((0, 0), |raw| iface.timestamp(raw));
                report.record(frame_no, link, ts, packet.data);
            }
            // Name resolution, statistics, decryption secrets, custom, ...
            _ => {}
        }
    }
    Ok(report)
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// Writes bare IP packets to a classic pcap file with `LINKTYPE_RAW` (101).
///
/// The file uses the little-endian nanosecond-resolution magic and a snapshot
/// length of [`RawIpWriter::SNAPLEN`]. Buffered data is flushed when the
/// writer is dropped; call [`RawIpWriter::finish`] to observe write errors.
#[derive(Debug)]
pub struct RawIpWriter {
    writer: PcapWriter<BufWriter<File>>,
    path: PathBuf,
}

impl RawIpWriter {
    /// Snapshot length written in the file header; also the largest packet
    /// [`RawIpWriter::write`] accepts.
    pub const SNAPLEN: u32 = 262_144;

    /// Creates (or truncates) `path` and writes the pcap file header.
    ///
    /// # Errors
    ///
    /// Fails if the file cannot be created or written.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path)
            .map_err(|e| anyhow!("{}: cannot create capture file: {e}", path.display()))?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: Self::SNAPLEN,
            datalink: DataLink::RAW,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
        };
        let writer = PcapWriter::with_header(BufWriter::new(file), header).map_err(|e| {
            anyhow!(
                "{}: cannot write pcap header: {}",
                path.display(),
                pcap_error(&e)
            )
        })?;
        Ok(Self {
            writer,
            path: path.to_owned(),
        })
    }

    /// Appends one IP packet with the given timestamp.
    ///
    /// # Errors
    ///
    /// Fails if `ts_nsec >= 1_000_000_000`, if `ts_sec` does not fit the
    /// 32-bit seconds field of classic pcap, if `ip` is longer than
    /// [`RawIpWriter::SNAPLEN`], or on I/O errors.
    pub fn write(&mut self, ts_sec: u64, ts_nsec: u32, ip: &[u8]) -> Result<()> {
        if u64::from(ts_nsec) >= NSEC_PER_SEC {
            bail!("invalid timestamp: {ts_nsec} nanoseconds is not below one second");
        }
        let ts_sec = u32::try_from(ts_sec).map_err(|_| {
            anyhow!("timestamp {ts_sec} s does not fit the 32-bit seconds field of pcap")
        })?;
        let len = u32::try_from(ip.len())
            .ok()
            .filter(|&len| len <= Self::SNAPLEN)
            .ok_or_else(|| {
                anyhow!(
                    "packet of {} bytes exceeds the pcap snapshot length {}",
                    ip.len(),
                    Self::SNAPLEN
                )
            })?;
        let record = RawPcapPacket {
            ts_sec,
            ts_frac: ts_nsec,
            incl_len: len,
            orig_len: len,
            data: Cow::Borrowed(ip),
        };
        self.writer.write_raw_packet(&record).map_err(|e| {
            anyhow!(
                "{}: cannot write packet: {}",
                self.path.display(),
                pcap_error(&e)
            )
        })?;
        Ok(())
    }

    /// Flushes buffered packets to the file.
    ///
    /// # Errors
    ///
    /// Fails if the buffered data cannot be written.
    pub fn finish(self) -> Result<()> {
        let path = self.path;
        self.writer
            .into_writer()
            .into_inner()
            .map(drop)
            .map_err(|e| {
                anyhow!(
                    "{}: cannot flush capture file: {}",
                    path.display(),
                    e.error()
                )
            })
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Reads until `buf` is full or EOF; returns the number of bytes read.
fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let Some(dest) = buf.get_mut(filled..) else {
            break;
        };
        match reader.read(dest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn io_error(name: &Path, e: &io::Error) -> anyhow::Error {
    anyhow!("{}: read error: {e}", name.display())
}

fn unsupported_link_type(name: &Path, linktype: u32, interface: Option<u32>) -> anyhow::Error {
    let whose = interface.map_or_else(String::new, |i| format!(" on interface {i}"));
    anyhow!(
        "{}: unsupported link type {linktype}{whose} (supported: 0/108 loopback, \
         1 Ethernet, 12/101 raw IP, 113 Linux SLL, 228 IPv4, 229 IPv6, 276 Linux SLL2)",
        name.display()
    )
}

/// Converts a value already reduced modulo one second.
fn nsec_u32(nsec: u64) -> u32 {
    u32::try_from(nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const LE: ByteOrder = ByteOrder::Little;
    const BE: ByteOrder = ByteOrder::Big;

    // -- temp files ---------------------------------------------------------

    /// A uniquely named file in the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("espgate-capture-test-{}-{n}-{tag}", std::process::id());
            Self(std::env::temp_dir().join(name))
        }

        fn with(tag: &str, bytes: &[u8]) -> Self {
            let file = Self::new(tag);
            std::fs::write(&file.0, bytes).unwrap();
            file
        }

        fn read(&self) -> Result<CaptureReport> {
            read_capture(&self.0)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn read_bytes(tag: &str, bytes: &[u8]) -> CaptureReport {
        TempFile::with(tag, bytes).read().unwrap()
    }

    fn read_err(tag: &str, bytes: &[u8]) -> (String, String) {
        let file = TempFile::with(tag, bytes);
        let err = file.read().unwrap_err();
        (format!("{err:#}"), file.0.display().to_string())
    }

    // -- packet builders ----------------------------------------------------

    fn ipv4_udp(payload: &[u8]) -> Vec<u8> {
        let total = u16::try_from(28 + payload.len()).unwrap().to_be_bytes();
        let udp_len = u16::try_from(8 + payload.len()).unwrap().to_be_bytes();
        let mut p = vec![
            0x45, 0, total[0], total[1], 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 1, 198, 51,
            100, 2,
        ];
        p.extend_from_slice(&[0x30, 0x39, 0x01, 0xF4, udp_len[0], udp_len[1], 0, 0]);
        p.extend_from_slice(payload);
        p
    }

    fn ipv6_udp(payload: &[u8]) -> Vec<u8> {
        let plen = u16::try_from(8 + payload.len()).unwrap().to_be_bytes();
        let mut p = vec![0x60, 0x01, 0x23, 0x45, plen[0], plen[1], 17, 64];
        p.extend_from_slice(&[0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(&[0x30, 0x39, 0x01, 0xF4, plen[0], plen[1], 0, 0]);
        p.extend_from_slice(payload);
        p
    }

    /// Ethernet frame; `tags` are (TPID, TCI) pairs inserted before the ethertype.
    fn ether(tags: &[(u16, u16)], ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
        for (tpid, tci) in tags {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Linux cooked v1: packet type, ARPHRD, addr len, 8-byte addr, protocol.
    fn sll(protocol: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0, 0, 0, 1, 0, 6, 0x02, 0, 0, 0, 0, 0x01, 0, 0];
        f.extend_from_slice(&protocol.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Linux cooked v2: protocol, reserved, ifindex, ARPHRD, type, addr len, addr.
    fn sll2(protocol: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = protocol.to_be_bytes().to_vec();
        f.extend_from_slice(&[0, 0, 0, 0, 0, 3, 0, 1, 0, 6]);
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01, 0, 0]);
        f.extend_from_slice(payload);
        f
    }

    fn arp() -> Vec<u8> {
        let mut a = vec![0, 1, 0x08, 0, 6, 4, 0, 1];
        a.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01, 192, 0, 2, 1]);
        a.extend_from_slice(&[0, 0, 0, 0, 0, 0, 192, 0, 2, 2]);
        a
    }

    fn pkt(ts_sec: u64, ts_nsec: u32, ip: &[u8]) -> CapturedPacket {
        CapturedPacket {
            ts_sec,
            ts_nsec,
            ip: ip.to_vec(),
        }
    }

    // -- file builders ------------------------------------------------------

    fn put16(order: ByteOrder, v: u16) -> [u8; 2] {
        match order {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    fn put32(order: ByteOrder, v: u32) -> [u8; 4] {
        match order {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    fn put64(order: ByteOrder, v: u64) -> [u8; 8] {
        match order {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    /// Classic pcap header.
    fn pcap_header(order: ByteOrder, nanos: bool, linktype: u32) -> Vec<u8> {
        let magic = if nanos { 0xA1B2_3C4D } else { 0xA1B2_C3D4 };
        let mut f = put32(order, magic).to_vec();
        f.extend_from_slice(&put16(order, 2));
        f.extend_from_slice(&put16(order, 4));
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&put32(order, 65535));
        f.extend_from_slice(&put32(order, linktype));
        f
    }

    fn pcap_record(order: ByteOrder, sec: u32, frac: u32, orig_len: usize, data: &[u8]) -> Vec<u8> {
        let mut r = put32(order, sec).to_vec();
        r.extend_from_slice(&put32(order, frac));
        r.extend_from_slice(&put32(order, u32::try_from(data.len()).unwrap()));
        r.extend_from_slice(&put32(order, u32::try_from(orig_len).unwrap()));
        r.extend_from_slice(data);
        r
    }

    /// Classic pcap with (sec, frac, data) records, orig_len = caplen.
    fn pcap_file(
        order: ByteOrder,
        nanos: bool,
        linktype: u32,
        recs: &[(u32, u32, &[u8])],
    ) -> Vec<u8> {
        let mut f = pcap_header(order, nanos, linktype);
        for (sec, frac, data) in recs {
            f.extend(pcap_record(order, *sec, *frac, data.len(), data));
        }
        f
    }

    fn ng_block(order: ByteOrder, kind: u32, body: &[u8]) -> Vec<u8> {
        let mut padded = body.to_vec();
        padded.resize(body.len() + padding(body.len()), 0);
        let len = u32::try_from(padded.len() + 12).unwrap();
        let mut b = put32(order, kind).to_vec();
        b.extend_from_slice(&put32(order, len));
        b.extend_from_slice(&padded);
        b.extend_from_slice(&put32(order, len));
        b
    }

    fn ng_options(order: ByteOrder, opts: &[(u16, &[u8])]) -> Vec<u8> {
        let mut o = Vec::new();
        for (code, value) in opts {
            o.extend_from_slice(&put16(order, *code));
            o.extend_from_slice(&put16(order, u16::try_from(value.len()).unwrap()));
            o.extend_from_slice(value);
            o.resize(o.len() + padding(value.len()), 0);
        }
        if !opts.is_empty() {
            o.extend_from_slice(&[0; 4]);
        }
        o
    }

    fn ng_shb(order: ByteOrder) -> Vec<u8> {
        let mut body = put32(order, 0x1A2B_3C4D).to_vec();
        body.extend_from_slice(&put16(order, 1));
        body.extend_from_slice(&put16(order, 0));
        body.extend_from_slice(&put64(order, u64::MAX));
        body.extend(ng_options(order, &[(4, b"espgate test")]));
        ng_block(order, BLOCK_SHB, &body)
    }

    fn ng_idb(order: ByteOrder, linktype: u16, snaplen: u32, opts: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = put16(order, linktype).to_vec();
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&put32(order, snaplen));
        body.extend(ng_options(order, opts));
        ng_block(order, BLOCK_IDB, &body)
    }

    fn ng_epb(order: ByteOrder, iface: u32, ts: u64, data: &[u8]) -> Vec<u8> {
        let len = u32::try_from(data.len()).unwrap();
        let mut body = put32(order, iface).to_vec();
        body.extend_from_slice(&put32(order, (ts >> 32) as u32));
        body.extend_from_slice(&put32(order, ts as u32));
        body.extend_from_slice(&put32(order, len));
        body.extend_from_slice(&put32(order, len));
        body.extend_from_slice(data);
        body.resize(body.len() + padding(data.len()), 0);
        body.extend(ng_options(order, &[(1, b"comment")]));
        ng_block(order, BLOCK_EPB, &body)
    }

    fn ng_pb(order: ByteOrder, iface: u16, ts: u64, data: &[u8]) -> Vec<u8> {
        let len = u32::try_from(data.len()).unwrap();
        let mut body = put16(order, iface).to_vec();
        body.extend_from_slice(&put16(order, 0));
        body.extend_from_slice(&put32(order, (ts >> 32) as u32));
        body.extend_from_slice(&put32(order, ts as u32));
        body.extend_from_slice(&put32(order, len));
        body.extend_from_slice(&put32(order, len));
        body.extend_from_slice(data);
        ng_block(order, BLOCK_PB, &body)
    }

    fn ng_spb(order: ByteOrder, data: &[u8]) -> Vec<u8> {
        let mut body = put32(order, u32::try_from(data.len()).unwrap()).to_vec();
        body.extend_from_slice(data);
        ng_block(order, BLOCK_SPB, &body)
    }

    // -- classic pcap -------------------------------------------------------

    #[test]
    fn classic_pcap_both_byte_orders_and_resolutions() {
        let v4 = ipv4_udp(b"hello");
        let v6 = ipv6_udp(b"world!");
        for (order, nanos, magic) in [
            (LE, false, PCAP_MAGIC_LE_US),
            (BE, false, PCAP_MAGIC_BE_US),
            (LE, true, PCAP_MAGIC_LE_NS),
            (BE, true, PCAP_MAGIC_BE_NS),
        ] {
            let (frac1, frac2) = if nanos {
                (123_456_789, 999_999_999)
            } else {
                (123_456, 999_999)
            };
            let bytes = pcap_file(
                order,
                nanos,
                LINKTYPE_RAW,
                &[(1_700_000_000, frac1, &v4), (1_700_000_001, frac2, &v6)],
            );
            assert_eq!(bytes[..4], magic);
            let report = read_bytes("classic.pcap", &bytes);
            let (nsec1, nsec2) = if nanos {
                (123_456_789, 999_999_999)
            } else {
                (123_456_000, 999_999_000)
            };
            assert_eq!(
                report,
                CaptureReport {
                    packets: vec![
                        (1, pkt(1_700_000_000, nsec1, &v4)),
                        (2, pkt(1_700_000_001, nsec2, &v6)),
                    ],
                    skipped: vec![],
                },
                "order {order:?}, nanos {nanos}"
            );
        }
    }

    #[test]
    fn classic_pcap_out_of_range_fraction_is_normalised() {
        let v4 = ipv4_udp(b"x");
        let bytes = pcap_file(LE, false, LINKTYPE_RAW, &[(10, 2_500_000, &v4)]);
        let report = read_bytes("frac.pcap", &bytes);
        assert_eq!(report.packets, vec![(1, pkt(12, 500_000_000, &v4))]);
    }

    #[test]
    fn ethernet_ipv4_ipv6_and_trailer_trimming() {
        let v4 = ipv4_udp(b"hi");
        let v6 = ipv6_udp(b"there");
        // Minimum-size frame: padded to 60 bytes, plus a 4-byte FCS.
        let mut padded = ether(&[], ETHERTYPE_IPV4, &v4);
        padded.resize(60, 0);
        padded.extend_from_slice(&[0xDE, 0xAD, 0xBE, 0xEF]);
        let bytes = pcap_file(
            BE,
            true,
            LINKTYPE_ETHERNET,
            &[(5, 6, &padded), (7, 8, &ether(&[], ETHERTYPE_IPV6, &v6))],
        );
        let report = read_bytes("eth.pcap", &bytes);
        assert_eq!(
            report,
            CaptureReport {
                packets: vec![(1, pkt(5, 6, &v4)), (2, pkt(7, 8, &v6))],
                skipped: vec![],
            }
        );
    }

    #[test]
    fn ethernet_vlan_tags() {
        let v4 = ipv4_udp(b"vlan");
        let v6 = ipv6_udp(b"qinq");
        let single = ether(&[(ETHERTYPE_VLAN, 100)], ETHERTYPE_IPV4, &v4);
        let double = ether(
            &[(ETHERTYPE_QINQ, 200), (ETHERTYPE_VLAN, 300)],
            ETHERTYPE_IPV6,
            &v6,
        );
        let old_qinq = ether(&[(ETHERTYPE_QINQ_OLD, 7)], ETHERTYPE_IPV4, &v4);
        let bytes = pcap_file(
            LE,
            false,
            LINKTYPE_ETHERNET,
            &[(1, 1, &single), (2, 2, &double), (3, 3, &old_qinq)],
        );
        let report = read_bytes("vlan.pcap", &bytes);
        assert_eq!(
            report,
            CaptureReport {
                packets: vec![
                    (1, pkt(1, 1_000, &v4)),
                    (2, pkt(2, 2_000, &v6)),
                    (3, pkt(3, 3_000, &v4)),
                ],
                skipped: vec![],
            }
        );
    }

    #[test]
    fn non_ip_frames_are_skipped_not_fatal() {
        let v4 = ipv4_udp(b"after");
        let arp_frame = ether(&[], ETHERTYPE_ARP, &arp());
        let lldp = ether(&[], 0x88CC, &[1, 2, 3, 4]);
        let llc = ether(&[], 0x0026, &[0x42, 0x42, 0x03]);
        let vlan_arp = ether(&[(ETHERTYPE_VLAN, 5)], ETHERTYPE_ARP, &arp());
        let bytes = pcap_file(
            LE,
            true,
            LINKTYPE_ETHERNET,
            &[
                (1, 0, &arp_frame),
                (2, 0, &lldp),
                (3, 0, &llc),
                (4, 0, &vlan_arp),
                (5, 0, &ether(&[], ETHERTYPE_IPV4, &v4)),
            ],
        );
        let report = read_bytes("nonip.pcap", &bytes);
        assert_eq!(report.packets, vec![(5, pkt(5, 0, &v4))]);
        let frames: Vec<usize> = report.skipped.iter().map(|(n, _)| *n).collect();
        assert_eq!(frames, [1, 2, 3, 4]);
        assert!(report.skipped[0].1.contains("ARP"), "{:?}", report.skipped);
        assert!(
            report.skipped[1].1.contains("0x88cc"),
            "{:?}",
            report.skipped
        );
        assert!(
            report.skipped[2].1.contains("802.3"),
            "{:?}",
            report.skipped
        );
        assert!(report.skipped[3].1.contains("ARP"), "{:?}", report.skipped);
    }

    #[test]
    fn truncated_frames_are_skipped_not_fatal() {
        let v4 = ipv4_udp(&[0xAB; 72]);
        let v6 = ipv6_udp(b"ok");
        let full = ether(&[], ETHERTYPE_IPV4, &v4);
        let short_eth = full[..10].to_vec();
        let short_vlan = ether(&[], ETHERTYPE_VLAN, &[0, 100]);
        let short_ip_hdr = full[..14 + 12].to_vec();
        let short_ipv6_hdr = ether(&[], ETHERTYPE_IPV6, &v6[..30]);
        let mut f = pcap_header(LE, false, LINKTYPE_ETHERNET);
        f.extend(pcap_record(LE, 1, 0, 10, &short_eth));
        f.extend(pcap_record(LE, 2, 0, 18, &short_vlan));
        f.extend(pcap_record(LE, 3, 0, full.len(), &short_ip_hdr));
        // Cut by a 64-byte snaplen: the IPv4 total length exceeds what was captured.
        f.extend(pcap_record(LE, 4, 0, full.len(), &full[..64]));
        f.extend(pcap_record(LE, 5, 0, 100, &short_ipv6_hdr));
        f.extend(pcap_record(LE, 6, 0, 0, &[]));
        f.extend(pcap_record(LE, 7, 0, full.len(), &full));
        let report = read_bytes("trunc.pcap", &f);
        assert_eq!(report.packets, vec![(7, pkt(7, 0, &v4))]);
        let reasons: Vec<(usize, &str)> = report
            .skipped
            .iter()
            .map(|(n, r)| (*n, r.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                (1, "truncated Ethernet header: 10 of 14 bytes captured"),
                (
                    2,
                    "truncated VLAN tag (ethertype 0x8100): 2 of 4 bytes captured"
                ),
                (3, "truncated IPv4 header: 12 of 20 bytes captured"),
                (
                    4,
                    "IPv4 packet truncated: total length 100, 50 bytes captured"
                ),
                (5, "truncated IPv6 header: 30 of 40 bytes captured"),
                (6, "truncated Ethernet header: 0 of 14 bytes captured"),
            ]
        );
    }

    #[test]
    fn linux_sll() {
        let v4 = ipv4_udp(b"sll");
        let v6 = ipv6_udp(b"sll6");
        let vlan = {
            let mut inner = vec![0x00, 0x64];
            inner.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            inner.extend_from_slice(&v6);
            sll(ETHERTYPE_VLAN, &inner)
        };
        let bytes = pcap_file(
            LE,
            false,
            LINKTYPE_LINUX_SLL,
            &[
                (1, 10, &sll(ETHERTYPE_IPV4, &v4)),
                (2, 20, &sll(ETHERTYPE_IPV6, &v6)),
                (3, 30, &vlan),
                (4, 40, &sll(ETHERTYPE_ARP, &arp())),
                (5, 50, &sll(ETHERTYPE_IPV4, &v4)[..12]),
            ],
        );
        let report = read_bytes("sll.pcap", &bytes);
        assert_eq!(
            report.packets,
            vec![
                (1, pkt(1, 10_000, &v4)),
                (2, pkt(2, 20_000, &v6)),
                (3, pkt(3, 30_000, &v6)),
            ]
        );
        assert_eq!(report.skipped.len(), 2);
        assert_eq!(report.skipped[0].0, 4);
        assert!(report.skipped[0].1.contains("ARP"));
        assert_eq!(
            report.skipped[1],
            (
                5,
                "truncated Linux cooked (SLL) header: 12 of 16 bytes captured".to_owned()
            )
        );
    }

    #[test]
    fn linux_sll2() {
        let v4 = ipv4_udp(b"sll2");
        let v6 = ipv6_udp(b"sll2-v6");
        let bytes = pcap_file(
            BE,
            true,
            LINKTYPE_LINUX_SLL2,
            &[
                (1, 1, &sll2(ETHERTYPE_IPV6, &v6)),
                (2, 2, &sll2(ETHERTYPE_IPV4, &v4)),
                (3, 3, &sll2(ETHERTYPE_ARP, &arp())),
                (4, 4, &sll2(ETHERTYPE_IPV4, &v4)[..19]),
            ],
        );
        let report = read_bytes("sll2.pcap", &bytes);
        assert_eq!(
            report.packets,
            vec![(1, pkt(1, 1, &v6)), (2, pkt(2, 2, &v4))]
        );
        assert_eq!(report.skipped.len(), 2);
        assert_eq!(report.skipped[0].0, 3);
        assert!(report.skipped[0].1.contains("ARP"));
        assert_eq!(
            report.skipped[1],
            (
                4,
                "truncated Linux cooked v2 (SLL2) header: 19 of 20 bytes captured".to_owned()
            )
        );
    }

    #[test]
    fn raw_ip_link_types() {
        let v4 = ipv4_udp(b"raw4");
        let v6 = ipv6_udp(b"raw6");
        let mut not_ip = v4.clone();
        not_ip[0] = 0x55;

        // LINKTYPE_RAW (101) and the BSD DLT_RAW value (12) take both versions.
        for linktype in [LINKTYPE_RAW, LINKTYPE_RAW_BSD] {
            let bytes = pcap_file(
                LE,
                true,
                linktype,
                &[(1, 1, &v4), (2, 2, &v6), (3, 3, &not_ip)],
            );
            let report = read_bytes("raw.pcap", &bytes);
            assert_eq!(
                report,
                CaptureReport {
                    packets: vec![(1, pkt(1, 1, &v4)), (2, pkt(2, 2, &v6))],
                    skipped: vec![(3, "not an IP packet (version nibble 5)".to_owned())],
                },
                "linktype {linktype}"
            );
        }

        let bytes = pcap_file(LE, true, LINKTYPE_IPV4, &[(1, 1, &v6), (2, 2, &v4)]);
        assert_eq!(
            read_bytes("ipv4.pcap", &bytes),
            CaptureReport {
                packets: vec![(2, pkt(2, 2, &v4))],
                skipped: vec![(
                    1,
                    "link layer says IPv4 but the IP version nibble is 6".to_owned()
                )],
            }
        );

        let bytes = pcap_file(LE, true, LINKTYPE_IPV6, &[(1, 1, &v6), (2, 2, &v4)]);
        assert_eq!(
            read_bytes("ipv6.pcap", &bytes),
            CaptureReport {
                packets: vec![(1, pkt(1, 1, &v6))],
                skipped: vec![(
                    2,
                    "link layer says IPv6 but the IP version nibble is 4".to_owned()
                )],
            }
        );
    }

    #[test]
    fn bsd_loopback_link_types() {
        let v4 = ipv4_udp(b"lo");
        let v6 = ipv6_udp(b"lo6");
        let null = |family: u32, ip: &[u8]| {
            let mut f = family.to_le_bytes().to_vec();
            f.extend_from_slice(ip);
            f
        };
        let looped = |family: u32, ip: &[u8]| {
            let mut f = family.to_be_bytes().to_vec();
            f.extend_from_slice(ip);
            f
        };
        let bytes = pcap_file(
            LE,
            false,
            LINKTYPE_NULL,
            &[
                (1, 0, &null(2, &v4)),
                (2, 0, &null(30, &v6)),
                (3, 0, &null(7, &v4)),
            ],
        );
        let report = read_bytes("null.pcap", &bytes);
        assert_eq!(
            report,
            CaptureReport {
                packets: vec![(1, pkt(1, 0, &v4)), (2, pkt(2, 0, &v6))],
                skipped: vec![(3, "non-IP loopback address family 7".to_owned())],
            }
        );
        let bytes = pcap_file(
            BE,
            false,
            LINKTYPE_LOOP,
            &[(1, 0, &looped(24, &v6)), (2, 0, &looped(2, &v4))],
        );
        assert_eq!(
            read_bytes("loop.pcap", &bytes).packets,
            vec![(1, pkt(1, 0, &v6)), (2, pkt(2, 0, &v4))]
        );
    }

    #[test]
    fn classic_pcap_fcs_bits_in_linktype_are_ignored() {
        let v4 = ipv4_udp(b"fcs");
        let mut frame = ether(&[], ETHERTYPE_IPV4, &v4);
        frame.extend_from_slice(&[1, 2, 3, 4]);
        // F bit set, FCS length 2 (x 16 bits).
        let linktype = LINKTYPE_ETHERNET | 0x1000_0000 | 0x4000_0000;
        let bytes = pcap_file(LE, false, linktype, &[(1, 0, &frame)]);
        assert_eq!(
            read_bytes("fcs.pcap", &bytes).packets,
            vec![(1, pkt(1, 0, &v4))]
        );
    }

    // -- pcapng -------------------------------------------------------------

    #[test]
    fn pcapng_interfaces_with_different_link_types_and_tsresol() {
        let v4 = ipv4_udp(b"ng-eth");
        let v6 = ipv6_udp(b"ng-raw");
        let v4b = ipv4_udp(b"ng-sll2");
        let tzone = put32(LE, 0);
        let tsoffset = put64(LE, 100);
        let mut f = ng_shb(LE);
        // Interface 0: Ethernet, default microsecond resolution.
        f.extend(ng_idb(LE, 1, 0, &[(2, b"eth0")]));
        // Interface 1: raw IP, nanosecond resolution; if_tzone trips up pcap-file.
        f.extend(ng_idb(LE, 101, 65535, &[(9, &[9]), (10, &tzone)]));
        // Interface 2: SLL2, 2^-10 s resolution and a +100 s offset.
        f.extend(ng_idb(LE, 276, 0, &[(9, &[0x8A]), (14, &tsoffset)]));
        f.extend(ng_epb(
            LE,
            0,
            1_700_000_000_123_456,
            &ether(&[], ETHERTYPE_IPV4, &v4),
        ));
        f.extend(ng_epb(LE, 1, 1_700_000_001_987_654_321, &v6));
        f.extend(ng_block(LE, 4, &[0; 4])); // name resolution block: ignored
        f.extend(ng_block(LE, 5, &[0; 12])); // interface statistics: ignored
        f.extend(ng_epb(
            LE,
            2,
            1000 * 1024 + 256,
            &sll2(ETHERTYPE_IPV4, &v4b),
        ));
        f.extend(ng_epb(LE, 0, 5, &ether(&[], ETHERTYPE_ARP, &arp())));
        f.extend(ng_pb(LE, 1, 42_000_000_001, &v6));
        f.extend(ng_spb(LE, &ether(&[], ETHERTYPE_IPV4, &v4)));
        f.extend(ng_epb(LE, 7, 0, &v6));
        let report = read_bytes("two-if.pcapng", &f);
        assert_eq!(
            report.packets,
            vec![
                (1, pkt(1_700_000_000, 123_456_000, &v4)),
                (2, pkt(1_700_000_001, 987_654_321, &v6)),
                (3, pkt(1_100, 250_000_000, &v4b)),
                (5, pkt(42, 1, &v6)),
                (6, pkt(0, 0, &v4)),
            ]
        );
        assert_eq!(report.skipped.len(), 2);
        assert_eq!(report.skipped[0].0, 4);
        assert!(report.skipped[0].1.contains("ARP"));
        assert_eq!(
            report.skipped[1],
            (7, "packet references undefined interface 7".to_owned())
        );
    }

    #[test]
    fn pcapng_big_endian_and_multiple_sections() {
        let v4 = ipv4_udp(b"be");
        let v6 = ipv6_udp(b"second section");
        let mut f = ng_shb(BE);
        f.extend(ng_idb(BE, 228, 0, &[(9, &[3])])); // milliseconds
        f.extend(ng_idb(BE, 229, 0, &[(9, &[12])])); // picoseconds
        f.extend(ng_epb(BE, 0, 1_700_000_002_500, &v4));
        f.extend(ng_epb(BE, 1, 1_234_567_890_123_456_789, &v6));
        // A new section resets the interface list and may switch byte order.
        f.extend(ng_shb(LE));
        f.extend(ng_idb(LE, 1, 0, &[]));
        f.extend(ng_epb(LE, 0, 3_000_001, &ether(&[], ETHERTYPE_IPV6, &v6)));
        f.extend(ng_epb(LE, 1, 0, &v6));
        let report = read_bytes("be.pcapng", &f);
        assert_eq!(
            report,
            CaptureReport {
                packets: vec![
                    (1, pkt(1_700_000_002, 500_000_000, &v4)),
                    (2, pkt(1_234_567, 890_123_456, &v6)),
                    (3, pkt(3, 1_000, &v6)),
                ],
                skipped: vec![(4, "packet references undefined interface 1".to_owned())],
            }
        );
    }

    #[test]
    fn pcapng_malformed_packet_block_is_skipped() {
        let v4 = ipv4_udp(b"fine");
        let mut f = ng_shb(LE);
        f.extend(ng_idb(LE, 101, 0, &[]));
        // EPB whose captured length points past the end of the block.
        let mut body = put32(LE, 0).to_vec();
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&put32(LE, 1000));
        body.extend_from_slice(&put32(LE, 1000));
        body.extend_from_slice(&[0x45; 8]);
        f.extend(ng_block(LE, BLOCK_EPB, &body));
        f.extend(ng_epb(LE, 0, 7, &v4));
        let report = read_bytes("bad-epb.pcapng", &f);
        assert_eq!(report.packets, vec![(2, pkt(0, 7_000, &v4))]);
        assert_eq!(
            report.skipped,
            vec![(
                1,
                "malformed enhanced packet block: captured length 1000 exceeds the block"
                    .to_owned()
            )]
        );
    }

    // -- errors and truncation ----------------------------------------------

    #[test]
    fn unsupported_link_type_is_an_error_naming_it() {
        let v4 = ipv4_udp(b"x");
        let (msg, name) = read_err("lt147.pcap", &pcap_file(LE, false, 147, &[(1, 0, &v4)]));
        assert!(msg.contains("unsupported link type 147"), "{msg}");
        assert!(msg.contains(&name), "{msg}");

        let mut f = ng_shb(LE);
        f.extend(ng_idb(LE, 101, 0, &[]));
        f.extend(ng_idb(LE, 127, 0, &[]));
        f.extend(ng_epb(LE, 0, 1, &v4));
        // An unsupported interface without packets is harmless ...
        assert_eq!(
            read_bytes("lt127-unused.pcapng", &f).packets,
            vec![(1, pkt(0, 1_000, &v4))]
        );
        // ... but packets on it are an error.
        f.extend(ng_epb(LE, 1, 1, &v4));
        let (msg, name) = read_err("lt127.pcapng", &f);
        assert!(
            msg.contains("unsupported link type 127 on interface 1"),
            "{msg}"
        );
        assert!(msg.contains(&name), "{msg}");
    }

    #[test]
    fn garbage_empty_and_missing_files_are_errors() {
        let (msg, name) = read_err("garbage.bin", b"this is not a packet capture\n");
        assert!(msg.contains(&name), "{msg}");
        assert!(msg.contains("not a pcap or pcapng"), "{msg}");
        // The magic bytes in lowercase hex: "this".
        assert!(msg.contains("unrecognised magic bytes 74686973"), "{msg}");

        let (msg, name) = read_err("empty.pcap", b"");
        assert!(msg.contains(&name), "{msg}");
        assert!(msg.contains("not a pcap or pcapng"), "{msg}");

        let missing = TempFile::new("missing.pcap");
        let msg = format!("{:#}", missing.read().unwrap_err());
        assert!(msg.contains(&missing.0.display().to_string()), "{msg}");

        let (msg, _) = read_err("short-header.pcap", &pcap_header(LE, false, 1)[..10]);
        assert!(msg.contains("truncated pcap file header"), "{msg}");

        // pcapng magic followed by an impossible block length.
        let mut f = ng_shb(LE);
        f.extend_from_slice(&put32(LE, BLOCK_EPB));
        f.extend_from_slice(&put32(LE, 13));
        f.extend_from_slice(&[0; 8]);
        let (msg, name) = read_err("corrupt.pcapng", &f);
        assert!(msg.contains("corrupt pcapng block"), "{msg}");
        assert!(msg.contains(&name), "{msg}");

        // A section header whose byte-order magic is neither order.
        let mut f = ng_shb(LE);
        f[8..12].copy_from_slice(&[0xDE, 0xAD, 0xBE, 0xEF]);
        let (msg, _) = read_err("bom.pcapng", &f);
        assert!(
            msg.contains("invalid section header byte-order magic deadbeef"),
            "{msg}"
        );
    }

    #[test]
    fn truncated_final_record_keeps_earlier_packets() {
        let v4 = ipv4_udp(b"first");
        let v6 = ipv6_udp(b"second");
        let bytes = pcap_file(LE, true, LINKTYPE_RAW, &[(1, 2, &v4), (3, 4, &v6)]);
        for cut in [1, 5, v6.len() + 15] {
            let report = read_bytes("cut.pcap", &bytes[..bytes.len() - cut]);
            assert_eq!(
                report,
                CaptureReport {
                    packets: vec![(1, pkt(1, 2, &v4))],
                    skipped: vec![(2, TRUNCATED_TAIL.to_owned())],
                },
                "cut {cut}"
            );
        }

        let mut f = ng_shb(BE);
        f.extend(ng_idb(BE, 101, 0, &[]));
        f.extend(ng_epb(BE, 0, 1_000_000, &v4));
        f.extend(ng_epb(BE, 0, 2_000_000, &v6));
        for cut in [1, 4, 30] {
            let report = read_bytes("cut.pcapng", &f[..f.len() - cut]);
            assert_eq!(
                report,
                CaptureReport {
                    packets: vec![(1, pkt(1, 0, &v4))],
                    skipped: vec![(2, TRUNCATED_TAIL.to_owned())],
                },
                "cut {cut}"
            );
        }
    }

    #[test]
    fn malformed_input_never_panics() {
        let v4 = ipv4_udp(b"fuzz");
        let v6 = ipv6_udp(b"fuzz6");
        let mut ng = ng_shb(LE);
        ng.extend(ng_idb(LE, 1, 0, &[(9, &[9])]));
        ng.extend(ng_idb(LE, 113, 0, &[]));
        ng.extend(ng_epb(
            LE,
            0,
            1,
            &ether(&[(ETHERTYPE_VLAN, 1)], ETHERTYPE_IPV4, &v4),
        ));
        ng.extend(ng_epb(LE, 1, 2, &sll(ETHERTYPE_IPV6, &v6)));
        ng.extend(ng_spb(LE, &ether(&[], ETHERTYPE_IPV6, &v6)));
        let classic = pcap_file(
            BE,
            false,
            LINKTYPE_ETHERNET,
            &[
                (1, 1, &ether(&[], ETHERTYPE_IPV4, &v4)),
                (2, 2, &ether(&[], ETHERTYPE_IPV6, &v6)),
            ],
        );
        let name = Path::new("fuzz");
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for seed in [&ng, &classic] {
            for len in 0..=seed.len() {
                let _ = read_from(&seed[..len], name);
            }
            for _ in 0..3000 {
                let mut mutated = seed.clone();
                for _ in 0..=next() % 4 {
                    let at = (next() % mutated.len() as u64) as usize;
                    mutated[at] = next() as u8;
                }
                let _ = read_from(&mutated[..], name);
            }
        }
    }

    // -- writer ---------------------------------------------------------------

    #[test]
    fn raw_ip_writer_round_trip() {
        let v4 = ipv4_udp(b"round");
        let v6 = ipv6_udp(b"trip");
        let big = ipv4_udp(&[0x5A; 65_000]);
        let expected = vec![
            (1, pkt(0, 0, &v4)),
            (2, pkt(1_700_000_000, 999_999_999, &v6)),
            (3, pkt(u64::from(u32::MAX), 1, &big)),
        ];
        let file = TempFile::new("out.pcap");
        let mut writer = RawIpWriter::create(&file.0).unwrap();
        for (_, p) in &expected {
            writer.write(p.ts_sec, p.ts_nsec, &p.ip).unwrap();
        }
        writer.finish().unwrap();

        let bytes = std::fs::read(&file.0).unwrap();
        assert_eq!(
            bytes[..24],
            [
                0x4D, 0x3C, 0xB2, 0xA1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x04, 0x00,
                101, 0, 0, 0
            ]
        );
        // First record header: ts 0.0, incl_len = orig_len = packet length.
        let len = u32::try_from(v4.len()).unwrap().to_le_bytes();
        assert_eq!(bytes[24..40], [[0; 8].as_slice(), &len, &len].concat());
        assert_eq!(bytes[40..40 + v4.len()], v4[..]);

        assert_eq!(
            file.read().unwrap(),
            CaptureReport {
                packets: expected,
                skipped: vec![],
            }
        );
    }

    #[test]
    fn raw_ip_writer_flushes_on_drop() {
        let v6 = ipv6_udp(b"dropped");
        let file = TempFile::new("drop.pcap");
        {
            let mut writer = RawIpWriter::create(&file.0).unwrap();
            writer.write(12, 34, &v6).unwrap();
        }
        assert_eq!(file.read().unwrap().packets, vec![(1, pkt(12, 34, &v6))]);
    }

    #[test]
    fn raw_ip_writer_rejects_unrepresentable_input() {
        let v4 = ipv4_udp(b"bad");
        let file = TempFile::new("reject.pcap");
        let mut writer = RawIpWriter::create(&file.0).unwrap();
        assert!(writer.write(1, 1_000_000_000, &v4).is_err());
        assert!(writer.write(1 << 32, 0, &v4).is_err());
        let huge = vec![0x45; RawIpWriter::SNAPLEN as usize + 1];
        assert!(writer.write(1, 0, &huge).is_err());
        writer.write(1, 0, &v4).unwrap();
        writer.finish().unwrap();
        assert_eq!(file.read().unwrap().packets, vec![(1, pkt(1, 0, &v4))]);
    }

    #[test]
    fn create_in_missing_directory_names_the_path() {
        let dir = TempFile::new("no-such-dir");
        let path = dir.0.join("out.pcap");
        let msg = format!("{:#}", RawIpWriter::create(&path).unwrap_err());
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
}
