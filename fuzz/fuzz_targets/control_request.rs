//! Arbitrary bytes as a control-socket request line (what the daemon
//! parses from any local client) and as the daemon's answer to each kind
//! of request (what the CLI, the lab and the cluster agent parse).
#![no_main]

use espgate_api::control::{parse_request, CostsAction, Request, Response, SaDir, SecretSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A request that parses says the same thing once written again.
    if let Ok(req) = parse_request(data) {
        let line = serde_json::to_vec(&req).expect("a request always serialises");
        let again = parse_request(&line).expect("a written request parses");
        assert_eq!(again, req);
    }
    // An answer: never a panic; one that parses writes back to a line
    // that parses to the same answer.
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
    ];
    for req in &asks {
        if let Ok(answer) = Response::parse(req, data) {
            let line = answer.to_line();
            let again =
                Response::parse(req, line.as_bytes()).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert_eq!(again.to_line(), line);
        }
    }
});
