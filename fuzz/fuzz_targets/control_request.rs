//! Arbitrary bytes as a control-socket request line (what the daemon
//! parses from any local client) and as the daemon's answer to each kind
//! of request (what the CLI, the lab and the cluster agent parse).
//!
//! The same bytes also go through `LineBuf`, the wiped line buffer both
//! sides read the socket into, in reads of sizes taken from the bytes
//! themselves.
#![no_main]

use espgate_api::control::{
    parse_request, CostsAction, LineBuf, Request, Response, SaDir, SecretSpec,
};
use libfuzzer_sys::fuzz_target;

/// Feeds `data` to a `LineBuf` in reads of 1..=64 bytes (sizes from the
/// data), taking every complete line out as the daemon does; the lines
/// and what is left must be exactly `data` split at its newlines.
fn line_buf(data: &[u8]) {
    let mut b = LineBuf::default();
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut pos = 0;
    let mut k = 0;
    while pos < data.len() {
        let want = usize::from(data[k % data.len()] % 64) + 1;
        k += 1;
        let n = want.min(data.len() - pos);
        let spare = b.spare(want);
        assert!(spare.len() >= want, "spare shorter than asked");
        assert!(spare.iter().all(|&x| x == 0), "spare not zeroed");
        spare[..n].copy_from_slice(&data[pos..pos + n]);
        b.filled(n);
        pos += n;
        // Every complete line, as the daemon takes them (the limit is
        // sometimes below the line's end: then the line waits).
        let limit = if want % 3 == 0 { want } else { usize::MAX };
        while let Some(end) = b.line_end(limit) {
            assert_eq!(b.bytes()[end], b'\n');
            got.push(b.bytes()[..end].to_vec());
            b.consume(end + 1);
        }
    }
    while let Some(end) = b.line_end(usize::MAX) {
        got.push(b.bytes()[..end].to_vec());
        b.consume(end + 1);
    }
    got.push(b.bytes().to_vec());
    let want: Vec<Vec<u8>> = data.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
    assert_eq!(got, want, "LineBuf lost or reordered bytes");
    b.consume(usize::MAX);
    assert!(b.bytes().is_empty());
}

fuzz_target!(|data: &[u8]| {
    // A request that parses says the same thing once written again.
    if let Ok(req) = parse_request(data) {
        let line = serde_json::to_vec(&req).expect("a request always serialises");
        let again = parse_request(&line).expect("a written request parses");
        assert_eq!(again, req);
        // Debug never shows an SA spec (it carries keys).
        if let Request::SaAdd { spec, .. } = &req {
            let dbg = format!("{req:?}");
            assert!(dbg.contains("(not shown: keys)"), "{dbg}");
            assert_eq!(format!("{spec:?}"), "(not shown: keys)");
            let _ = spec.expose();
        }
    }
    // An answer: never a panic; one that parses writes back to a line
    // that parses to the same answer, pretty or not, and the daemon's
    // wiped line is that line and a newline.
    let asks = [
        Request::Status,
        Request::SaList,
        Request::WiresharkKeys,
        Request::SaAdd {
            conn: "c".into(),
            dir: SaDir::In,
            spec: SecretSpec::new(String::new()),
        },
        Request::Costs {
            action: CostsAction::Reset,
        },
        Request::ClusterExport,
    ];
    for req in &asks {
        if let Ok(answer) = Response::parse(req, data) {
            let line = answer.to_line();
            let again =
                Response::parse(req, line.as_bytes()).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(again.to_line(), line);
            let pretty = answer.to_pretty();
            let from_pretty =
                Response::parse(req, pretty.as_bytes()).unwrap_or_else(|e| panic!("{e}: {pretty}"));
            assert_eq!(from_pretty.to_line(), line);
            let secret = answer.to_secret_line();
            assert_eq!(&secret[..secret.len() - 1], line.as_bytes());
            assert_eq!(secret.last(), Some(&b'\n'));
        }
    }
    if !data.is_empty() {
        line_buf(data);
    }
    let _ = Response::error(String::from_utf8_lossy(data));
});
